import sys

from pool._kube_dev._cli import main

sys.exit(main())
