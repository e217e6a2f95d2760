"""A token goes round the ring of ranks LAPS times, each rank adding one; rank 0 checks the count.

agora mpirun -n 4 -- python -m mpi4py examples/mpi_ring.py [LAPS]
"""

import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
laps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
right, left = (rank + 1) % size, (rank - 1) % size
token = 0
for _ in range(laps):
    if rank == 0:
        token = comm.sendrecv(token + 1, dest=right, source=left)
    else:
        token = comm.recv(source=left)
        comm.send(token + 1, dest=right)
expected = laps * size if rank == 0 else (laps - 1) * size + rank
host = socket.gethostname()
print(f"rank {rank} of {size} on {host}: token {token} after {laps} laps (expected {expected})")
if token != expected:
    sys.exit(1)
