"""The command-line tools: fqd, fq-send, fq-recv, fq-admin, figg, fyrehose, opencluster."""
