//! Ring-buffer ingest without the kernel: decode and state-apply throughput on one core, over a
//! pre-built buffer of realistic records made with `tracer_core::decode::encode`.
use std::hint::black_box;

use anyhow::{Result, bail};
use tracer_common::nv::{DriverAbi, DriverVersion, class};
use tracer_core::{
    decode::{self, Event, Header, IoctlOp, Location, MemoryAlloc, MemoryKind, RmAllocForm, encode},
    state::TracerState,
};

use crate::sys;

/// A contiguous buffer of records (each 8-byte aligned, as in the ring buffer) and their spans.
pub struct Corpus {
    pub bytes: Vec<u8>,
    pub spans: Vec<(usize, usize)>,
    pub mix: String,
    pub abi: DriverAbi,
    /// Memory allocations per pass (each freed again within the pass).
    pub allocs: u64,
}

/// `processes` processes, each: open nvidiactl, RM client + device + subdevice, then `cycles` of
/// { RM_ALLOC 2 MiB vidmem, RM_CONTROL ×2, RM_FREE of the allocation made `live` cycles earlier },
/// then free everything and close. Replaying the buffer returns the state to where it started.
pub fn build(processes: u32, cycles: u32, live: u32) -> Result<Corpus> {
    let abi = DriverAbi::for_version(DriverVersion::new(550, 54, 15));
    let mut events: Vec<Event> = Vec::new();
    let mut t = 1_000_000_000u64;
    let mut hdr = |tgid: u32| {
        t += 1_000;
        Header { ktime_ns: t, tgid, pid: tgid, cgroup_id: 4_000 + (tgid as u64 % 2) }
    };
    let alloc = |client: u32,
                 parent: u32,
                 handle: u32,
                 c: u32,
                 memory: Option<MemoryAlloc>,
                 dev: Option<u32>,
                 sub: Option<u32>| {
        IoctlOp::RmAlloc {
            client,
            parent,
            handle,
            class: c,
            status: 0,
            form: RmAllocForm::Nvos64,
            memory,
            device_instance: dev,
            subdevice_instance: sub,
        }
    };
    let (mut allocs, mut controls, mut frees) = (0u64, 0u64, 0u64);
    for p in 0..processes {
        let tgid = 200_000 + p;
        let fd = 5;
        let dev = encode::ctl(0x1000 + p as u64);
        let client = 0xc1d0_0000 + p;
        let (device, subdevice) = (0xcaf0_0001, 0xcaf0_0002);
        events.push(Event::FdOpened { header: hdr(tgid), device: dev, fd, open_flags: 2, seeded: false });
        let io = |op: IoctlOp, h: Header| Event::Ioctl(encode::ioctl(h, dev, fd, op, &abi));
        events.push(io(alloc(client, client, client, class::NV01_ROOT_CLIENT, None, None, None), hdr(tgid)));
        events.push(io(alloc(client, client, device, class::NV01_DEVICE_0, None, Some(0), None), hdr(tgid)));
        events.push(io(alloc(client, device, subdevice, class::NV20_SUBDEVICE_0, None, None, Some(0)), hdr(tgid)));
        let mem = MemoryAlloc { bytes: 2 << 20, location: Location::Vidmem, kind: MemoryKind::Physical };
        for i in 0..cycles {
            let h = 0xbeef_0000 + i;
            events.push(io(alloc(client, device, h, class::NV01_MEMORY_LOCAL_USER, Some(mem), None, None), hdr(tgid)));
            allocs += 1;
            for cmd in [0x2080_0153u32, 0x0000_0d01] {
                events.push(io(IoctlOp::RmControl { client, object: subdevice, cmd, status: 0 }, hdr(tgid)));
                controls += 1;
            }
            if i >= live {
                let old = 0xbeef_0000 + i - live;
                events.push(io(IoctlOp::RmFree { client, parent: device, handle: old, status: 0 }, hdr(tgid)));
                frees += 1;
            }
        }
        for i in cycles.saturating_sub(live)..cycles {
            let old = 0xbeef_0000 + i;
            events.push(io(IoctlOp::RmFree { client, parent: device, handle: old, status: 0 }, hdr(tgid)));
            frees += 1;
        }
        events.push(io(IoctlOp::RmFree { client, parent: client, handle: client, status: 0 }, hdr(tgid)));
        frees += 1;
        events.push(Event::FdClosed { header: hdr(tgid), device: dev, fd, replaced: false });
    }
    let mut bytes = Vec::new();
    let mut spans = Vec::with_capacity(events.len());
    for ev in &events {
        let b = encode::event(ev, &abi);
        // Sanity: the buffer must decode to exactly what was encoded.
        match decode::decode(&b, &abi) {
            Ok(back) if back == *ev => {}
            Ok(back) => bail!("encode/decode mismatch: {ev:?} came back as {back:?}"),
            Err(e) => bail!("encoded record does not decode: {e}"),
        }
        let start = bytes.len();
        bytes.extend_from_slice(&b);
        spans.push((start, b.len()));
        while bytes.len() % 8 != 0 {
            bytes.push(0);
        }
    }
    let n = events.len();
    let pct = |k: u64| 100.0 * k as f64 / n as f64;
    let mix = format!(
        "{n} records: RM_ALLOC (2 MiB vidmem, nested params) {:.0}%, RM_CONTROL {:.0}%, RM_FREE {:.0}%, \
         opens/closes/client setup the rest; {processes} processes, {live} live allocations each",
        pct(allocs),
        pct(controls),
        pct(frees)
    );
    Ok(Corpus { bytes, spans, mix, abi, allocs })
}

/// Events per second of `passes` passes (median), decode only and decode + state apply.
pub struct Throughput {
    pub records: usize,
    pub decode_per_s: f64,
    pub apply_per_s: f64,
    pub decode_errors: u64,
    /// Ledger check after all passes: (allocations counted, expected, live allocations left).
    pub ledger: (u64, u64, usize),
}

pub fn measure(c: &Corpus, passes: usize) -> Throughput {
    let mut dec = Vec::new();
    let mut app = Vec::new();
    let mut errors = 0u64;
    for _ in 0..passes {
        let t = sys::mono_ns();
        for &(s, l) in &c.spans {
            match decode::decode(&c.bytes[s..s + l], &c.abi) {
                Ok(ev) => {
                    black_box(&ev);
                }
                Err(_) => errors += 1,
            }
        }
        dec.push(c.spans.len() as f64 * 1e9 / (sys::mono_ns() - t) as f64);
    }
    let mut state = TracerState::new(16_384);
    for _ in 0..passes {
        let t = sys::mono_ns();
        for &(s, l) in &c.spans {
            if let Ok(ev) = decode::decode(&c.bytes[s..s + l], &c.abi) {
                black_box(state.apply(&ev, 12_345));
            }
        }
        app.push(c.spans.len() as f64 * 1e9 / (sys::mono_ns() - t) as f64);
    }
    let snap = state.snapshot();
    Throughput {
        records: c.spans.len(),
        decode_per_s: sys::median(&dec),
        apply_per_s: sys::median(&app),
        decode_errors: errors,
        ledger: (snap.counters.allocations, c.allocs * passes as u64, snap.totals.live_allocations),
    }
}

#[cfg(test)]
mod tests;
