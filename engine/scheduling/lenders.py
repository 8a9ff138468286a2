"""Lenders waiting: gangs within their tenant's nominal quota that their cohort's pool stops, because what
their tenant lent is in use by borrowers.

While one waits, no gang that would borrow from that cohort is admitted (``engine.scheduling.policy``,
**Lent capacity is always reclaimable**): what the reclaim frees goes to the lender, not to a borrower that
resubmits as fast as GPUs come free and would have to be reclaimed in turn. The policy marks a gang when it
looks at its quota, and forgets it when the quota no longer stops it or the gang leaves the queue; the
marks cross a continue-as-new in the snapshot.
"""

from __future__ import annotations

from engine.scheduling.tenancy import Blocked

__all__ = ["Lenders"]


class Lenders:
    """Per root cohort, the ids of its lenders waiting (each looked up and changed in O(1))."""

    def __init__(self, by_root: dict[str, set[str]] | None = None) -> None:
        self.by_root: dict[str, set[str]] = by_root or {}

    def update(self, root: str | None, gang_id: str, blocked: Blocked | None) -> None:
        """Mark the gang if ``blocked`` says it is a lender waiting (within nominal, stopped by the pool), else
        forget it."""
        if root is None:
            return
        if blocked is not None and blocked.kind == "cohort" and blocked.within_nominal:
            self.by_root.setdefault(root, set()).add(gang_id)
        else:
            self.forget(root, gang_id)

    def forget(self, root: str | None, gang_id: str) -> None:
        lenders = self.by_root.get(root) if root is not None else None
        if root is not None and lenders is not None and gang_id in lenders:
            lenders.discard(gang_id)
            if not lenders:
                del self.by_root[root]

    def waits(self, root: str | None, gang_id: str) -> bool:
        """Whether the gang is a lender waiting in the root cohort."""
        lenders = self.by_root.get(root) if root is not None else None
        return lenders is not None and gang_id in lenders

    def waiting(self, root: str | None) -> bool:
        """Whether a lender of the root cohort waits (then nothing new borrows from it)."""
        return root is not None and root in self.by_root

    def clear(self) -> None:
        self.by_root.clear()

    def rows(self) -> dict[str, list[str]]:
        """The snapshot's form: sorted, so a snapshot is deterministic."""
        return {root: sorted(ids) for root, ids in sorted(self.by_root.items())}
