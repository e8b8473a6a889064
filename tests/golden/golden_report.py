"""The end every check_*.py script shares: one JSON line with what it compared and how many
problems, then each problem (the first 50) on a line of its own; the exit status is 1 when there
is any."""
import json


def finish(summary, problems):
    print(json.dumps({**summary, "problems": len(problems)}))
    for p in problems[:50]:
        print("problem:", p)
    return 1 if problems else 0
