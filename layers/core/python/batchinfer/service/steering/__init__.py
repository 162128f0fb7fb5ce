"""Steering a batch that exists: run again what did not succeed (`retry`, with the never-dispatched
requests filed first by `never_dispatched`), pause and resume (`pausing`), its priority among its account's
batches (`priority`), and where its spending cap stops it (`spending_cap`).

May touch: the batch, its lanes and its request items, each change fenced on what it was decided from;
stopping or settling a batch goes through `..lifecycle`.
"""
