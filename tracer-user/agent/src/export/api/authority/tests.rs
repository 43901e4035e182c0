use loona_hpack::{Decoder, Encoder};

use super::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A header list: (name, value) pairs in order.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(&mut out, kind, flags, stream, &[payload]);
    out
}

/// A gRPC request's fields as grpcio sends them over `unix:/run/gpu-tracer/api.sock`.
fn request(authority: &str) -> Fields {
    [
        (":scheme", "http"),
        (":method", "POST"),
        (":authority", authority),
        (":path", "/gputracer.v1.GpuTracer/GetStatus"),
        ("te", "trailers"),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-python/1.76.0 grpc-c/51.0.0 (linux; chttp2)"),
    ]
    .iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

fn encode_with(enc: &mut Encoder<'_>, fields: &Fields) -> Vec<u8> {
    enc.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
}

/// The frames of `bytes` after the preface: (type, flags, stream, payload).
fn frames(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    assert!(bytes.starts_with(PREFACE));
    let mut rest = &bytes[PREFACE.len()..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
        assert!(len <= MAX_FRAME, "a frame of {len} bytes");
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
        out.push((rest[3], rest[4], stream, rest[FRAME_HEADER..FRAME_HEADER + len].to_vec()));
        rest = &rest[FRAME_HEADER + len..];
    }
    out
}

/// The header blocks of `bytes` as the server's decoder (fresh, as h2's) reads them, with each
/// block's HEADERS flags.
fn blocks(bytes: &[u8]) -> Vec<(u8, Fields)> {
    let mut dec = Decoder::new();
    let mut out = Vec::new();
    let mut open: Option<(u8, Vec<u8>)> = None;
    for (kind, flags, _, payload) in frames(bytes) {
        let (hflags, mut frag) = match (kind, open.take()) {
            (HEADERS, None) => {
                let skip = if flags & PRIORITY != 0 { 5 } else { 0 };
                assert_eq!(flags & PADDED, 0, "re-encoded blocks are not padded");
                (flags, payload[skip..].to_vec())
            }
            (CONTINUATION, Some((f, mut frag))) => {
                frag.extend_from_slice(&payload);
                (f, frag)
            }
            (_, None) => continue,
            (k, Some(_)) => panic!("frame type {k} inside a header block"),
        };
        if flags & END_HEADERS != 0 {
            out.push((hflags, dec.decode(&frag).expect("h2's decoder reads the block")));
        } else {
            open = Some((hflags, std::mem::take(&mut frag)));
        }
    }
    out
}

fn rewrite(input: &[u8], chunk: usize) -> (Vec<u8>, u64) {
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    for c in input.chunks(chunk) {
        r.feed(c, &mut out);
    }
    r.finish(&mut out);
    (out, r.rewritten)
}

#[test]
fn a_socket_path_authority_becomes_localhost_and_everything_else_passes() {
    let mut enc = Encoder::new();
    let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
    let data = frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(&settings);
    input.extend(frame(HEADERS, END_HEADERS, 1, &encode_with(&mut enc, &request("%2Frun%2Fgpu-tracer%2Fapi.sock"))));
    input.extend(&data);
    // A second request: the client's encoder refers to the first one's fields in its dynamic
    // table; the rewriter decodes with that table and re-encodes without one.
    input.extend(frame(HEADERS, END_HEADERS, 3, &encode_with(&mut enc, &request("/run/gpu-tracer/api.sock"))));
    // A valid authority is left as it is.
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, &encode_with(&mut enc, &request("localhost:9400"))));
    for chunk in [1, 7, 4096, input.len()] {
        let (out, rewritten) = rewrite(&input, chunk);
        assert_eq!(rewritten, 2, "chunks of {chunk}");
        let f = frames(&out);
        assert_eq!(f[0].0, 0x4, "SETTINGS first, as it came");
        assert_eq!(&out[PREFACE.len()..PREFACE.len() + settings.len()], &settings[..]);
        assert_eq!(f[2].3, data[FRAME_HEADER..].to_vec(), "DATA as it came");
        let b = blocks(&out);
        assert_eq!(b.len(), 3);
        for (i, (flags, fields)) in b.iter().enumerate() {
            let want = ["localhost", "localhost", "localhost:9400"][i];
            assert_eq!(fields, &request(want), "block {i}, chunks of {chunk}");
            assert!(fields.iter().all(|(n, v)| n != b":authority" || is_authority(v)));
            assert_eq!(flags & END_STREAM != 0, i == 2, "END_STREAM kept");
        }
    }
}

#[test]
fn padded_prioritised_and_continued_blocks_are_followed_and_long_ones_split() {
    let mut enc = Encoder::new();
    let mut fields = request("%2Ftmp%2Fa.sock");
    fields.push((b"x-long".to_vec(), vec![b'a'; 40_000]));
    let block = encode_with(&mut enc, &fields);
    // HEADERS with padding and priority carrying the first 100 bytes, the rest in CONTINUATIONs.
    let mut first = vec![4u8];
    first.extend([0x80, 0, 0, 0, 15]);
    first.extend(&block[..100]);
    first.extend([0u8; 4]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, PADDED | PRIORITY, 1, &first));
    let rest: Vec<&[u8]> = block[100..].chunks(MAX_FRAME).collect();
    for (i, c) in rest.iter().enumerate() {
        input.extend(frame(CONTINUATION, if i + 1 == rest.len() { END_HEADERS } else { 0 }, 1, c));
    }
    let (out, rewritten) = rewrite(&input, 999);
    assert_eq!(rewritten, 1);
    let f = frames(&out);
    assert!(f.len() >= 3, "40 kB of fields need three frames of 16 kB");
    assert_eq!(f[0].1 & PRIORITY, PRIORITY, "priority kept");
    assert_eq!(&f[0].3[..5], &[0x80, 0, 0, 0, 15]);
    assert!(f[1..].iter().all(|x| x.0 == CONTINUATION && x.2 == 1));
    assert_eq!(f.last().unwrap().1 & END_HEADERS, END_HEADERS);
    let mut want = fields.clone();
    want[2].1 = LOCALHOST.to_vec();
    assert_eq!(blocks(&out), vec![(PRIORITY, want)]);
}

#[test]
fn what_cannot_be_followed_passes_as_it_came_from_there_on() {
    let mut enc = Encoder::new();
    let good = frame(HEADERS, END_HEADERS, 1, &encode_with(&mut enc, &request("%2Fa")));
    // An index far beyond both tables: not HPACK a server can decode.
    let bad = frame(HEADERS, END_HEADERS, 3, &[0xff, 0xff, 0xff, 0x7f]);
    let after = frame(HEADERS, END_HEADERS, 5, &encode_with(&mut enc, &request("%2Fb")));
    let mut input = PREFACE.to_vec();
    input.extend(&good);
    input.extend(&bad);
    input.extend(&after);
    let (out, rewritten) = rewrite(&input, 5);
    assert_eq!(rewritten, 1, "only the block before the bad one");
    let tail = [bad.clone(), after.clone()].concat();
    assert!(out.ends_with(&tail), "the bad block and everything after it, byte for byte");

    // A frame larger than the server allows, a truncated frame at the end, padding longer than
    // the frame, a CONTINUATION on another stream: the same.
    let mut huge = frame(0x0, 0, 1, &[]);
    huge[..3].copy_from_slice(&[0x01, 0x00, 0x00]);
    let cases: [Vec<u8>; 4] = [
        [huge.clone(), vec![1, 2, 3]].concat(),
        frame(HEADERS, END_HEADERS, 1, &encode_with(&mut Encoder::new(), &request("%2Fc")))[..20].to_vec(),
        frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 0x82]),
        [frame(HEADERS, 0, 1, &[0x82]), frame(CONTINUATION, END_HEADERS, 3, &[0x84])].concat(),
    ];
    for (i, c) in cases.iter().enumerate() {
        let input = [PREFACE, c].concat();
        for chunk in [1, 3, input.len()] {
            assert_eq!(rewrite(&input, chunk), (input.clone(), 0), "case {i}, chunks of {chunk}");
        }
    }
}

#[test]
fn a_client_cannot_grow_the_dynamic_table_beyond_the_servers() {
    // A table size update to 1 MiB (HPACK §6.3), then a field: refused as h2 would refuse it.
    let mut block = Vec::new();
    loona_hpack::encoder::encode_integer_into(1 << 20, 5, 0x20, &mut block).unwrap();
    block.push(0x82);
    let input = [PREFACE, &frame(HEADERS, END_HEADERS, 1, &block)].concat();
    assert_eq!(rewrite(&input, input.len()), (input, 0));
}

#[test]
fn tokios_io_reads_through_and_writes_pass() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(64);
        let mut fix = AuthorityFix::new(server);
        let mut enc = Encoder::new();
        let input = [PREFACE, &frame(HEADERS, END_HEADERS, 1, &encode_with(&mut enc, &request("%2Fs")))].concat();
        let writer = tokio::spawn(async move {
            client.write_all(&input).await.unwrap();
            client.shutdown().await.unwrap();
            let mut back = Vec::new();
            client.read_to_end(&mut back).await.unwrap();
            back
        });
        let mut got = Vec::new();
        fix.read_to_end(&mut got).await.unwrap();
        assert_eq!(blocks(&got), vec![(END_HEADERS, request("localhost"))]);
        fix.write_all(b"server bytes").await.unwrap();
        fix.shutdown().await.unwrap();
        drop(fix);
        assert_eq!(writer.await.unwrap(), b"server bytes");
    });
}

proptest::proptest! {
    /// Any bytes in any chunks: no panic, nothing lost (garbage passes as it came, so the output
    /// is never shorter than what could not be followed), the preface first.
    #[test]
    fn garbage_never_panics_and_passes(body in proptest::collection::vec(proptest::num::u8::ANY, 0..4096), chunk in 1usize..300) {
        let input = [PREFACE, &body].concat();
        let (out, _) = rewrite(&input, chunk);
        proptest::prop_assert!(out.starts_with(PREFACE));
        let (whole, _) = rewrite(&input, input.len());
        proptest::prop_assert_eq!(out, whole, "chunking changes nothing");
    }

    /// Valid requests with random authorities, values and split points: the server reads the same
    /// fields, each authority h2 would refuse as localhost.
    #[test]
    fn random_requests_read_back_with_only_bad_authorities_replaced(
        authorities in proptest::collection::vec("[ -~]{0,40}", 1..6),
        chunk in 1usize..200,
    ) {
        let mut enc = Encoder::new();
        let mut input = PREFACE.to_vec();
        let mut want = Vec::new();
        for (i, a) in authorities.iter().enumerate() {
            let fields = request(a);
            input.extend(frame(HEADERS, END_HEADERS, 2 * i as u32 + 1, &encode_with(&mut enc, &fields)));
            let mut w = fields.clone();
            if !is_authority(a.as_bytes()) {
                w[2].1 = LOCALHOST.to_vec();
            }
            want.push((END_HEADERS, w));
        }
        let (out, _) = rewrite(&input, chunk);
        proptest::prop_assert_eq!(blocks(&out), want);
    }
}
