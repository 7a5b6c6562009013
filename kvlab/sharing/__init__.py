"""Sharing one machine's model slot between browser visitors, API clients and agents, fairly and within caps.

- `kvlab.sharing.cost`: what a run costs before it is queued (token steps from columns and tokens) and how
  many seconds that is here (`Throughput`, measured by the runs that finished on this machine).
- `kvlab.sharing.limits`: the caps (token steps per run, runs per client, runs waiting, model slots), named
  constants a deployer may change through environment settings.
- `kvlab.sharing.scheduler`: admission (a run over a cap is refused in one line naming the setting, before it
  is queued), the fair order for the model slot (least service in a recent window first) and each waiting
  run's position and wait.

No gradio and no model here: the web app's glue is `kvlab.ui.hosting.turns`.
"""
