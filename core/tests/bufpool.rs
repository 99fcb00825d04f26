//! The buffer pool is the process's: this test runs in a process of its own, and its steps run
//! one after another, so no other code takes or returns buffers between them.

use dart_core::bufpool::{Buf, IDLE_BYTES_MAX};

#[test]
fn pooled_buffers_hand_out_exactly_their_bytes_come_back_after_their_last_handle_and_stay_bounded()
{
    a_buffer_is_reused_after_its_last_handle();
    a_truncated_buffer_hands_out_its_first_bytes();
    idle_buffers_stay_bounded();
}

fn a_buffer_is_reused_after_its_last_handle() {
    const SIZE: usize = 100_000;
    let mut buf = Buf::take(SIZE);
    buf.as_mut_slice().fill(7);
    let bytes = buf.freeze();
    assert_eq!(bytes.len(), SIZE);
    assert!(bytes.iter().all(|&b| b == 7));
    let ptr = bytes.as_ptr();
    let slice = bytes.slice(10..20);
    drop(bytes);
    // Still held by `slice`: a new buffer of the class is another one.
    let other = Buf::take(SIZE);
    assert_ne!(other.as_ref().as_ptr(), ptr);
    drop(other);
    assert_eq!(&slice[..], &[7; 10]);
    drop(slice);
    // The class's idle buffers now include ours; one of them comes back.
    let mut seen = false;
    let mut held = Vec::new();
    for _ in 0..4 {
        let b = Buf::take(SIZE);
        seen |= b.as_ref().as_ptr() == ptr;
        held.push(b);
    }
    assert!(seen, "the buffer went back to its class");
    let plain = Buf::take(10).freeze();
    assert_eq!(plain.len(), 10);
}

fn a_truncated_buffer_hands_out_its_first_bytes() {
    for size in [10, 100_000, 9 << 20] {
        let mut buf = Buf::take(size);
        buf.as_mut_slice().fill(3);
        buf.truncate(size / 2);
        assert_eq!(buf.len(), size / 2);
        buf.truncate(size);
        assert_eq!(buf.len(), size / 2, "truncate never lengthens");
        let bytes = buf.freeze();
        assert_eq!(bytes.len(), size / 2);
        assert!(bytes.iter().all(|&b| b == 3));
    }
}

fn idle_buffers_stay_bounded() {
    // More 8 MiB buffers dropped at once than the pool keeps idle: the rest are freed. A buffer
    // from the pool still holds what was written to it; a new one is zeroed (an address says
    // nothing: the allocator may hand a freed one out again at the same place).
    const CLASS: usize = 8 << 20;
    let kept = IDLE_BYTES_MAX / CLASS;
    let many: Vec<_> = (0..kept + 4)
        .map(|_| {
            let mut b = Buf::take(CLASS);
            b.as_mut_slice().fill(0xa5);
            b
        })
        .collect();
    drop(many);
    let again: Vec<_> = (0..kept + 4).map(|_| Buf::take(CLASS)).collect();
    let reused = again.iter().filter(|b| b.as_ref()[0] == 0xa5).count();
    // The steps before left less than one such buffer's worth idle (small buffers).
    assert!(
        (kept - 1..=kept).contains(&reused),
        "{reused} of {} came back; the pool keeps {kept}",
        kept + 4
    );
}
