"""What is read on a worker's own machine, by its nanny, the worker process, `oomguard
doctor` and host memory admission: cgroup counters and the kernel log (`cgroup`), host
memory and pressure (`readings`), the userspace OOM killers running there (`oom_killers`),
the flight record and crash files (`flight`, `paths`), signal senders (`senders`) and which
task made the worker grow (`growth`). Never imported by the scheduler side."""
