"""`python -m kubeproxy.lab.apiserver`."""

from kubeproxy.lab.apiserver.serve_command import main

main(prog_name="python -m kubeproxy.lab.apiserver")
