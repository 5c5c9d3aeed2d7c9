"""CI integration on the service side: GitHub-style webhook events (`signature`, `events`),
the sweep of a pushed commit's kernels (`launch`), its verdict (`verdict`, `status`) and its
JUnit report (`junit`). Not to be confused with `.ci/`, this repository's own CI script."""
