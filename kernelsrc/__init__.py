"""Kernel source revisions: kernels/src read at a commit of the kernel repository (`git`). The
store keeps each revision once per content as a source bundle that workers compile
(store/bundles.py)."""
