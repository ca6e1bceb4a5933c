"""What the commands do, as library calls that return typed results.

The command line (``spotbook.cli``) parses arguments, makes one of these calls and
renders what it returns; a Python caller makes the same calls and gets the same
answers: status with the cluster's view (:mod:`.runs`), submit and follow a Job
(:mod:`.submit`), drills (:mod:`.drill`), running a cloud plan (:mod:`.plans`).
"""
