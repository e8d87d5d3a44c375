"""A fault-injection suite for the replay stores, with a checker that reads only the history.

``python -m faults run --store sqlite --faults kill-client,clock --seconds 60 --seed 1`` starts
the store's servers on loopback, runs honest clients and attackers in processes of their own
while a nemesis injects faults on a seeded schedule, and writes every redemption attempt to a
history file; ``python -m faults check HISTORY`` judges that file alone. docs/guarantees.md
states the promises, the definitions the checker applies and the runs made.
"""
