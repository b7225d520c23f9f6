"""The Ray cluster: joining it, what it has and can launch, what the sweep asks of it, staging on its nodes.

- ``connect.py``:     join the cluster or start a local Ray; the alive nodes (listed here only)
- ``autoscale.py``:   the autoscaler read from a live cluster: what it can launch, what it is launching
- ``request.py``:     one standing autoscaler request per cluster, the sum of every sweep's
- ``stage_nodes.py``: staging on every node before the first trial (and on nodes that join later),
                      the driver's folders shipped through Ray, the nodes' progress lines
- ``ray_internals.py``: the trial's and hooks' uses of Ray's private modules, each with why (none is public)
- ``jobs.py``:        a sweep as a Ray Job on a running cluster, and its jobs (Ray's Jobs API: ``sweep submit``)
"""
