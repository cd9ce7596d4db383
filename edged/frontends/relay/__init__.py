"""Frontend worker processes and the daemon, joined by one Unix socket each (see edged.daemon.workers).

A worker reads and writes the HTTP and gRPC wires on a core of its own and hands the daemon decoded inference
requests (remote.py); the daemon runs them on the one copy of each model and answers every other request of the
worker's clients as its own (host.py). Both ends speak the framing of wire.py.
"""
