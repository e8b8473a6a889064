"""The clock the Python baselines share with mltrain's runtime::seconds_since_exec."""
import os
import time


def seconds_since_exec():
    """Seconds since this process was exec'd: /proc/self/stat's start time (field 22, clock ticks)
    against CLOCK_BOOTTIME, so the interpreter's start-up and imports count."""
    stat = open("/proc/self/stat").read()
    start = int(stat[stat.rindex(")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start
