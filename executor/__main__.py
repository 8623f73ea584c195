import sys

from executor._main import main

sys.exit(main())
