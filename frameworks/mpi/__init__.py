"""The MPI framework: gang-scheduled Open MPI jobs launched through Agora (``agora mpirun``).

Built on :mod:`agora.sdk` alone: a gang REQUEST gets every slot at once; one placeholder
executor per agent holds them; ``mpirun`` runs in the rank-0 member's executor with Agora's
launcher standing in for ssh, which reaches the other members through framework messages.
"""
