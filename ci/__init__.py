"""CI integration on the service side: GitHub-style webhook events (`signature`, `events`), a
commit's verdict (`verdict`, `status`), its commit statuses (`notify`) and its JUnit report
(`junit`). The sweep of a pushed commit is started by submit/ci.py. Not to be confused with
`.ci/`, this repository's own CI script."""
