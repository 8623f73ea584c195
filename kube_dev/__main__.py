import sys

from kube_dev._cli import main

sys.exit(main())
