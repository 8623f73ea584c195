import sys

from executor.mcp_gateway._main import main

sys.exit(main())
