import sys

from executor.interpreter._main import main

sys.exit(main())
