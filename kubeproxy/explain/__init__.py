"""`kubeproxy explain NAMESPACE/NAME`: every rule, element and virtual server that handles a Service."""
