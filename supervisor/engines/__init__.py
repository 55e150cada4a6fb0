"""Engine adapters: the exact command line and environment of each model server, built purely.

Nothing here starts a process. Keeping command construction pure makes it testable without GPUs,
which matters because the environment is where multi-node runs go wrong: one missing NCCL
variable turns a working tensor-parallel group into one that hangs on its first all-reduce.
"""
