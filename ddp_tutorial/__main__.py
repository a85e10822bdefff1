"""``python -m ddp_tutorial`` runs the doctor (see ``ddp_tutorial.doctor``)."""

import sys

from ddp_tutorial.doctor import main

sys.exit(main())
