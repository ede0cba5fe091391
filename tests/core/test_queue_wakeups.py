"""When a consumer waiting in a queue is called back: on the loop's next turn, once the
publisher's batch is all in the queue, so the consumer takes it in one go (calling it in
the read's own turn was tried and cost throughput: bench/RESULTS.md, round two's
"latency at 10k msg/s"); a consumer's error stays its own."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from fqbroker.core.message import Message, runs_of
from fqbroker.core.publisher import Publisher
from fqbroker.core.queue import Notify, Queue
from fqbroker.core.queuespec import QueueSpec
from fqbroker.storage.configdb.catalog import Catalog


class Consumer:
    """Takes what the queue holds when called back, and waits in line again."""

    def __init__(self, queue: Queue, fail: bool = False) -> None:
        self.queue = queue
        self.fail = fail
        self.got: list[list[bytes]] = []
        self.ready: Notify | None = queue.notify_ready(self)

    def queue_ready(self) -> bool:
        self.ready = None
        if self.fail:
            raise RuntimeError("consumer failed")
        batch = self.queue.take(1000)
        if batch:
            self.got.append(batch)
        self.ready = self.queue.notify_ready(self)
        return True


def messages(n: int) -> list[Message]:
    return [Message(b"ex", b"r", b"m%d" % i) for i in range(n)]


async def test_a_consumer_takes_the_batch_in_one_go_on_the_next_turn(catalog: Catalog) -> None:
    queue = Queue(QueueSpec(b"q"))
    catalog.router.bind(b"ex", b"prefix:", queue)
    consumer = Consumer(queue)
    publisher = Publisher(catalog.router, catalog.flush_dirty)
    sent = messages(5)
    assert publisher.publish(runs_of(sent))
    assert consumer.got == [] and queue.backlog == 5
    await asyncio.sleep(0)
    # The whole batch, in one take, in order.
    assert consumer.got == [[m.peer_frame() for m in sent]]
    assert queue.backlog == 0
    assert publisher.publish(runs_of(messages(2)))
    await asyncio.sleep(0)
    assert len(consumer.got) == 2


async def test_without_a_publisher_the_consumer_is_called_back_next_turn(
    catalog: Catalog,
) -> None:
    queue = Queue(QueueSpec(b"q"))
    consumer = Consumer(queue)
    frames = [m.peer_frame() for m in messages(3)]
    queue.offer(frames)
    assert consumer.got == []
    await asyncio.sleep(0)
    assert consumer.got == [frames]


async def test_public_queue_consumers_share_in_line_order(catalog: Catalog) -> None:
    queue = Queue(QueueSpec(b"q", private=False))
    catalog.router.bind(b"ex", b"prefix:", queue)
    first, second = Consumer(queue), Consumer(queue)
    publisher = Publisher(catalog.router, catalog.flush_dirty)
    sent = [m.peer_frame() for m in messages(10)]
    assert publisher.publish(runs_of(messages(10)))
    await asyncio.sleep(0)
    assert first.got == [sent[:5]] and second.got == [sent[5:]]


async def test_a_failing_consumer_is_the_loops_to_report_not_the_publishers(
    catalog: Catalog,
) -> None:
    queue = Queue(QueueSpec(b"q", private=False))
    catalog.router.bind(b"ex", b"prefix:", queue)
    failing, good = Consumer(queue, fail=True), Consumer(queue)
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        publisher = Publisher(catalog.router, catalog.flush_dirty)
        assert publisher.publish(runs_of(messages(4)))  # raises nothing
        assert publisher.stats.routed == 4
        for _ in range(3):
            await asyncio.sleep(0)
        assert [type(c["exception"]) for c in reported] == [RuntimeError]
        assert failing.got == []
        # The other consumer woken was still called back, and took the batch.
        assert sum(map(len, good.got)) == 4
    finally:
        loop.set_exception_handler(None)


def test_a_wake_up_goes_to_the_loop_running_now_not_one_before() -> None:
    # The loop is kept between wake-ups (no getpid() a wake-up): one that stopped is
    # not called on again, whatever loop kind runs next.
    def one_loop(loop: asyncio.AbstractEventLoop) -> None:
        async def main() -> None:
            queue = Queue(QueueSpec(b"q"))
            consumer = Consumer(queue)
            queue.offer([Message(b"ex", b"r", b"m").peer_frame()])
            assert consumer.got == []
            await asyncio.sleep(0)
            assert consumer.got == [[Message(b"ex", b"r", b"m").peer_frame()]]

        try:
            loop.run_until_complete(main())
        finally:
            loop.close()

    kinds: list[Any] = [asyncio.new_event_loop]
    try:
        import uvloop

        kinds.append(uvloop.new_event_loop)
    except ModuleNotFoundError:
        pass
    for kind in kinds * 2:
        one_loop(kind())


def test_wake_ups_of_two_loops_running_at_once_in_two_threads_stay_on_their_own() -> None:
    # Two brokers embedded in one process, each on its own thread and loop: the loop kept
    # between wake-ups is the thread's, or one thread's wake-up would be called soon on the
    # other's loop (not thread-safe, and run there).
    rounds = 300
    errors: list[BaseException] = []
    turn = threading.Barrier(2, timeout=10)

    def run() -> None:
        async def main() -> None:
            me = threading.get_ident()
            queue = Queue(QueueSpec(b"q"))
            ran_on: list[int] = []

            class Here(Consumer):
                def queue_ready(self) -> bool:
                    ran_on.append(threading.get_ident())
                    return super().queue_ready()

            consumer = Here(queue)
            for i in range(rounds):
                await asyncio.to_thread(turn.wait)  # both threads wake at about once
                queue.offer([Message(b"ex", b"r", b"m%d" % i).peer_frame()])
                for _ in range(100):
                    if len(consumer.got) > i:
                        break
                    await asyncio.sleep(0.001)
            assert len(consumer.got) == rounds and set(ran_on) == {me}

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)
            turn.abort()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
