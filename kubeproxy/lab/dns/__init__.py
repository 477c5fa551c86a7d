"""The DNS lab: wire format, a small responder, the seed's health check and a load generator.

- `kubeproxy dns check --server IP[:PORT]`: check.py
- `kubeproxy dns load --server IP[:PORT] --rate R --duration D`: load.py (workers: worker.py)
- `python -m kubeproxy.lab.dns.responder --listen IP:PORT`: responder.py
"""
