"""Captioning on a Ray cluster: engine actors that run the same stages (``workers``), a pool
that places windows on them (``pool``), and the corpus backend that decodes on the cluster
while this process stays the one writer of every output (``backend``). Needs ``ffai[ray]``."""
