"""Installation: the pinned installs with a progress line (``install``, run by the Makefile before
anything else is installed: the standard library only) and a wheel set for offline machines
(``wheelhouse``)."""
