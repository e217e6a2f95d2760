"""Each rank contributes rank+1; an allreduce sums them and every rank checks the sum.

agora mpirun -n 4 -- python -m mpi4py examples/mpi_allreduce.py
agora mpirun -n 4 -- python -m mpi4py examples/mpi_allreduce.py --abort 2   # rank 2 aborts
"""

import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
if "--abort" in sys.argv and rank == int(sys.argv[sys.argv.index("--abort") + 1]):
    print(f"rank {rank}: aborting the job with code 3", flush=True)
    comm.Abort(3)
total = comm.allreduce(rank + 1, op=MPI.SUM)
expected = size * (size + 1) // 2
print(f"rank {rank} of {size} on {socket.gethostname()}: sum {total} (expected {expected})")
if total != expected:
    sys.exit(1)
