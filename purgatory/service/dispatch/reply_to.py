"""Which topics a registration's ``reply_to`` may name (service layer concept: the reply_to
allow-list).

A registration may ask for its callback on a topic of its own (``reply_to``) instead of the
callbacks topic. Left open, that lets any client make the service write anywhere its Kafka
credentials reach: Kafka's internal topics (``__consumer_offsets``), a schema registry's
(``_schemas``), the service's own requests topic (a callback read back as input), or a new
topic per typo. So a ``reply_to`` is allowed only when it is:

* the callbacks topic (the same as leaving it out), or
* one of ``PURGATORY_REPLY_TO_TOPICS`` (exact names), or
* a name starting with ``PURGATORY_REPLY_TO_PREFIX`` (``purgatory.reply.`` by default; empty:
  no prefix);

and never, whatever the settings say, a name starting with ``_`` (Kafka's internal topics) or
one of the service's own topics (requests, signals, dead letters, changelog, snapshots).

The check belongs to intake: :meth:`Dispatcher.register
<purgatory.service.dispatch.dispatcher.Dispatcher.register>` applies it to every registration,
from HTTP and Kafka alike. A journaled registration replayed at restore does not pass through
it: it was accepted under the settings of its time, and its callback is still delivered where
it asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from purgatory._codec import RecordError
from purgatory.service.settings import _TOPIC_FIELDS, Settings

__all__ = ["DEFAULT_PREFIX", "ReplyToPolicy"]

#: The default ``PURGATORY_REPLY_TO_PREFIX``.
DEFAULT_PREFIX = "purgatory.reply."
_SHOWN = 5  # exact names listed in a refusal; the rest are counted


@dataclass(frozen=True, slots=True)
class ReplyToPolicy:
    """The topics a ``reply_to`` may name.

    Args:
        callbacks_topic: the service's callbacks topic, always allowed.
        topics: exact names allowed.
        prefix: names starting with it are allowed ("" allows none by prefix).
        own_topics: the service's other topics, never allowed.
    """

    callbacks_topic: str
    topics: frozenset[str] = frozenset()
    prefix: str = DEFAULT_PREFIX
    own_topics: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, settings: Settings) -> ReplyToPolicy:
        """The policy of ``settings`` (``PURGATORY_REPLY_TO_TOPICS`` and ``_PREFIX``)."""
        own = {getattr(settings, name) for name in _TOPIC_FIELDS} - {settings.topic_callbacks}
        return cls(
            callbacks_topic=settings.topic_callbacks,
            topics=frozenset(settings.reply_to_topics or ()),
            prefix=settings.reply_to_prefix,
            own_topics=frozenset(own),
        )

    def check(self, topic: str | None) -> None:
        """Refuse a ``reply_to`` the policy does not allow (None: the callbacks topic).

        Raises:
            RecordError: on the field ``reply_to``, saying why and what is allowed.
        """
        if topic is None or topic == self.callbacks_topic:
            return
        if topic.startswith("_"):
            why = f"{topic!r} starts with '_', a Kafka internal topic"
        elif topic in self.own_topics:
            why = f"{topic!r} is one of the service's own topics"
        elif topic in self.topics or (self.prefix and topic.startswith(self.prefix)):
            return
        else:
            why = f"{topic!r} is not allowed"
        raise RecordError("reply_to", f"{why}; {self.allowed()}")

    def allowed(self) -> str:
        """What a ``reply_to`` may name, in words (for a refusal)."""
        choices = [f"the callbacks topic {self.callbacks_topic!r} (or no reply_to)"]
        if self.prefix:
            choices.append(f"a topic starting with {self.prefix!r}")
        if self.topics:
            names = sorted(self.topics)
            shown = ", ".join(repr(name) for name in names[:_SHOWN])
            more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
            choices.append(f"one of {shown}{more}")
        return "allowed: " + ", or ".join(choices)
