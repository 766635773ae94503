"""The node agent: beside the daemon on every node of a Kubernetes cluster, it picks the
node's profile from the cluster's LatencyProfiles and LatencyRecommends by the node's
labels, asks the daemon (over D-Bus) to hold it, and reports on the Node what is held and
whether it holds (docs/fleet.md). It never touches the kernel: the daemon owns the
machine's state."""
