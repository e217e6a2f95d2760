"""Launch N tasks, retry each failure up to 3 times, exit when every task is done."""

import sys

from agora import sdk

SHAPE = sdk.Resources.parse("cpus:0.25;mem:32")
LIVE = {sdk.TaskState.STAGING, sdk.TaskState.STARTING, sdk.TaskState.RUNNING, sdk.TaskState.KILLING}


class Quickstart(sdk.Scheduler):
    def __init__(self, count: int, command: str) -> None:
        self.command, self.todo, self.tries = command, list(range(count)), [0] * count
        self.done, self.failed = 0, 0

    def offers(self, driver, offers):
        for offer in offers:
            tasks, free = [], offer.resources
            while self.todo and free.fits(SHAPE):
                i = self.todo.pop(0)
                self.tries[i] += 1
                tasks.append(sdk.TaskSpec(f"task-{i}-{self.tries[i]}", self.command, SHAPE))
                free -= SHAPE
            driver.launch(offer, tasks)  # launching nothing declines the offer

    def status_update(self, driver, status):
        i, ok = int(status.task_id.split("-")[1]), status.state is sdk.TaskState.FINISHED
        if status.state not in LIVE and (ok or self.tries[i] == 3):
            self.done, self.failed = self.done + 1, self.failed + (not ok)
            print(f"{status.task_id}: {status.state.name} ({self.done}/{len(self.tries)} done)")
        elif status.state not in LIVE:
            self.todo.append(i)  # failed or lost: try again on a later offer
        if self.done == len(self.tries):
            driver.stop()


count, command = int(sys.argv[1]), " ".join(sys.argv[2:]) or "echo hello from $AGORA_TASK_ID"
scheduler = Quickstart(count, command)
sdk.BlockingSchedulerDriver(scheduler, sdk.FrameworkInfo(name="quickstart")).run()
sys.exit(1 if scheduler.failed else 0)
