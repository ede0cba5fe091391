"""fqbroker benchmarks: `make bench` (python -m bench) runs them all and prints a report."""
