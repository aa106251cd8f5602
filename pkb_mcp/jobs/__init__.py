"""Long work as jobs: the `scheduler` (a queue in front of the node's GPUs, deadlines, cancellation),
the SQLite job `store`, and for a Ray cluster the `cluster` (the server's side) and `cluster_node`
(the actor on each node). A job runs one verb of `pkb_mcp.service.VERBS` on its `RunRequest`."""
