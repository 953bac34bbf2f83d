"""How many frames a bundle may hold (``wire.BUNDLE``), as every ack of the collector
offers it: the size that keeps a round over the connections draining a backlog within
``round_s`` (half the unreachable window), at the message rate this collector measured.
Why each step: docs/architecture.md ("Bundles")."""

from __future__ import annotations

from slurmgpu.wire import MAX_BUNDLE

BUNDLE_OFFER_MAX = 32
BUNDLE_RATE_DEFAULT = 4000.0  # messages a second, until measured
BUNDLE_MEASURE_S = 1.0
BUNDLE_MIN_SAMPLE = 100  # fewer messages in a window keep the last rate
BUNDLE_ROUND_SHARE = 2  # a round within 1/2 of the unreachable window
BUNDLE_RATE_RISE = 0.25  # a faster rate is taken a quarter of the way; a slower one at once


class BundleOffer:
    def __init__(self, round_s: float, now: float) -> None:
        self.round_s = round_s
        self.offer = 0  # what acks say now (0: nothing yet)
        self.rate = BUNDLE_RATE_DEFAULT
        self.busy = 0  # messages handled since ``measured_at``
        self.measured_at = now
        self.next_at = 0.0  # (monotonic) when the next offer is due

    def update(self, mono: float, nodes: int) -> bool:
        """The offer from ``mono`` on, for ``nodes`` connections; True when it changed."""
        self.next_at = mono + BUNDLE_MEASURE_S
        if self.busy >= BUNDLE_MIN_SAMPLE and mono > self.measured_at:
            rate = self.busy / (mono - self.measured_at)
            self.rate = rate if rate < self.rate else self.rate + BUNDLE_RATE_RISE * (rate - self.rate)
        self.busy, self.measured_at = 0, mono
        offer = int(self.rate * self.round_s / max(1, nodes))
        if self.offer:  # (at most doubled a step: the nodes heard grow after a start)
            offer = min(offer, 2 * self.offer)
        offer = max(1, min(BUNDLE_OFFER_MAX, MAX_BUNDLE, offer))
        changed, self.offer = offer != self.offer, offer
        return changed
