"""Emulated multi-device cluster (issue: hardware in the loop across devices): network namespaces + tc tbf links +
cgroup CPU quotas + pyzmq workers that execute Voltron plans for real. See docs/cluster.md."""
