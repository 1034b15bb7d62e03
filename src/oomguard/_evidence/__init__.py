"""What a death leaves behind, read on the nanny's side (pure but for /proc, /sys and the
Kubernetes API): cgroup counters, the flight record, growth, the cause, the death report."""
