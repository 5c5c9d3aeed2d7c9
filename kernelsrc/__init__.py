"""Kernel source revisions: kernels/src read at a commit of the kernel repository (`git`), and
stored once per content as a source bundle that workers compile (`bundles`)."""
