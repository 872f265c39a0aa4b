"""make chaos, in parts (`scripts/chaos.py` is the entry; what the run does: cli.py's docstring).

cli.py              the flags, and the run from start to clean-up
plan.py             the plan from the seed (pure)
outcomes.py         what each job's plan meant and whether the job matches it (pure)
stack.py            the processes the run owns: PostgreSQL, Redis, gunicorn, Celery workers and beat,
                    the pod watch
proxy.py            the TCP proxy in front of the API server (the API server outage)
api.py              dispatch's API, every request counted
kube.py             the cluster, through the run's own client (direct)
context.py          the run's state and what the faults and the jobs act on
jobs.py             submitting and cancelling the planned jobs
faults.py           which function makes which fault, and running one at its moment
faults_services.py  worker kill, Redis and PostgreSQL restarts, API server outage, label domain change
faults_cluster.py   eviction, node loss, foreign pods
faults_kueue.py     the Kueue preemption wave and the run's own queues
collect.py          after the faults: settling, every job as the API shows it, the database against the
                    cluster
report.py           the figures, report.json and the summary
"""
