"""Round 21's PD handoff findings, run in a subprocess on the real SGLang by ``test_round21_findings.py`` (the
plug-in replaces SGLang's classes process-wide). Built on :mod:`disagg_world`'s worlds (SGLang's own prefill
bootstrap queue, decode prealloc/transfer queues, ``DecodeReqToTokenPool``, ``MetadataBuffers``, ``ChunkCache``,
``release_kv_cache``; kvshield's hooks installed by the plug-in). Each oracle reads pages, page owners, rows and
metadata indices back, never only a status."""

import disagg_world as dw
import wire
from disagg_world import MooncakeWorld


def _pool_state(w):
    return w.da.available_size(), w.rows.available_size(), w.dmeta_rows.available_size()


def meta_abort_never_drains():
    """Over a metadata transport (Mooncake), a client disconnects while its request A's KV is in flight; A's prefill
    then finishes sending: its last chunk lands in A's (quarantined) pages and A's own coverage row (A's room, A's
    tenant) lands at A's own held metadata index, and A's sender reports Success: the transfer is over and nothing
    more can be written. Promised (README: pages "quarantined until it drains"; no page lost): A's pages and metadata
    index come back once its transfer concluded. What happens: MetadataTransport.acknowledged is only ever set by a
    commit, which A never reaches, so A is expired and its pages and metadata index are held back forever; every
    client disconnect mid-transfer permanently removes its pages and one metadata index from the decode server (a
    decode server with K metadata indices admits nothing after K such disconnects)."""
    w = MooncakeWorld("r21-meta-drain", metadata_rows=2)
    before = _pool_state(w)
    pa, a = w.req("A", 16)
    w.prefill_request(pa, 30.0)
    w.decode_request(a)
    w.send_chunk(pa, end_idx=12)
    w.tq.queue[0].kv_receiver.abort()  # the client disconnects: SGLang's abort_request fails the receiver
    assert w.tq.pop_transferred() == [] and a.finished_reason.status_code == 500
    w.send_chunk(pa, last=True)  # the transfer drains: A's last chunk and A's own row at A's own index
    for _ in range(3):  # later scheduler steps (the ack timeout is 0 here: expired at once)
        w.pre.pop_preallocated()
        w.tq.pop_transferred()
        w.da.end_step()
    after = _pool_state(w)
    assert after == before, (f"(pages, rows, metadata indices) before A: {before}, after A's transfer drained: {after};"
                             f" alarms: {w.decode.alarms()}")


class DropsAChunkRoute(wire.Route):
    """A metadata transport (Mooncake's shape) that loses one chunk's KV writes yet completes the transfer: the later
    chunks land, the metadata (kvshield's row, written honestly by prefill, included) is copied after the last one,
    and the receiver reports Success; the silent-success failure SGLang's security update describes ("The transfer
    reported success, and no component raised an exception")."""

    def __init__(self, route, drop_chunk):
        super().__init__(route.src_kv, route.dst_kv, route.receiver, route.src_meta, route.dst_meta, route.page_size,
                         route.buffers)
        self.drop_chunk, self.chunks = drop_chunk, 0

    def carry(self, sender, page_ids):
        chunk, self.chunks = self.chunks, self.chunks + 1
        if chunk != self.drop_chunk:
            return super().carry(sender, page_ids)
        self.sent += len(page_ids)  # the chunk is "sent": its pages are never written


def meta_transport_drops_a_chunk():
    """Promise 1: a page reserved but never written is never readable as the request's, whatever the transport
    reports. Over a metadata transport a request's first chunk (pages 0-1 of 4) is lost in flight while the last chunk
    and the metadata land and the receiver reports Success; the reserved pages still hold an earlier request's KV
    (planted, as the incident scenarios plant it). Expected: an abort, or exactly the prompt's KV. What happens: the
    commit records as written every slot the row covers (``_coverage`` -> ``Handoff.record_covered``), and the row
    counts the pages prefill *handed* its sender, not pages the transport wrote: the request commits (200) and decodes
    over the stale bytes of its first two pages."""
    w = MooncakeWorld("r21-meta-drop")
    p, d = w.req("r", 16)
    expected = w.pkv.read(w.prefill_request(p, 100.0))
    w.decode_request(d)
    dslots = w.decode_slots(d)
    for b in w.dkv.buffers():  # stale KV of an earlier request on the reserved pages
        b[dslots] = -9.0
    w.ROUTE = wire.ROUTES[d.bootstrap_room] = DropsAChunkRoute(wire.ROUTES[d.bootstrap_room], drop_chunk=0)
    w.send_chunk(p, end_idx=8)
    w.send_chunk(p, last=True)
    view = w.client_view(d, w.tq.pop_transferred())
    stale = 0 if view[2] is None else int((view[2] == -9.0).sum())
    assert view[0] != 200 or stale == 0, f"request decoded (200) over {stale} stale values on pages its transfer never wrote"
    dw.assert_safe(view, expected)


SCENARIOS = {
    "meta_drain": (meta_abort_never_drains, {}),
    "meta_drop": (meta_transport_drops_a_chunk, {}),
}


def main():
    dw.run(SCENARIOS)
