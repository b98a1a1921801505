"""Bytes a ring all-reduce sends between islands (Pathways §5.3's hierarchical
reduction): what records, tf_tput.plan's projection (dcn.py) and the trainers' own
schedules count as crossing the links. Framework-neutral arithmetic, as models.py's;
where a run's processes sit in islands is runtime/islands.py's, how its mesh splits
across them island_split.py's.
"""


def ring_link_bytes(nbytes: int, members: int, num_islands: int) -> int:
  """Bytes a ring all-reduce of `nbytes` over `members` sends between islands, the
  members island-major in equal shares: K of the ring's edges cross (each island's
  last member to the next island's first, the last island's back to the first).
  One island: nothing crosses."""
  if num_islands < 2:
    return 0
  return ring_bytes_between(nbytes, [m * num_islands // members for m in range(members)])


def ring_bytes_between(nbytes: int, member_islands: list) -> int:
  """Bytes a ring all-reduce of `nbytes` sends between islands, member i (in ring
  order) in island member_islands[i]: every edge between two islands carries
  2(P-1)/P of the bytes (reduce-scatter, then all-gather). Transport headers are not
  counted."""
  members = len(member_islands)
  crossing = sum(member_islands[i] != member_islands[(i + 1) % members]
                 for i in range(members))
  return 2 * crossing * (members - 1) * nbytes // members if members > 1 else 0


def analytic_link_bytes(gradient_bytes: int, num_islands: int) -> int:
  """Bytes the hierarchical reduction sends over all inter-island links per step:
  every island's shards of the gradient, all-reduced across the K islands as a ring
  (one member per island), sum one gradient's bytes per island: 2(K-1) gradients."""
  return ring_link_bytes(gradient_bytes, num_islands, num_islands)
