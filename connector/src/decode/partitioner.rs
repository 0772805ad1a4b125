//! The partition a producer's partitioner gives a key: librdkafka's own
//! functions, so the check agrees with the producers bit for bit (Java's
//! default is murmur2, "functionally equivalent" per librdkafka's docs).

use crate::config::Partitioner;

/// The partition of `key` among `count` partitions under `p`.
pub(super) fn partition_of(p: Partitioner, key: &[u8], count: i32) -> i32 {
    use rdkafka::bindings as rd;
    type Fn = unsafe extern "C" fn(
        *const rd::rd_kafka_topic_t,
        *const std::ffi::c_void,
        usize,
        i32,
        *mut std::ffi::c_void,
        *mut std::ffi::c_void,
    ) -> i32;
    let f: Fn = match p {
        Partitioner::Murmur2 => rd::rd_kafka_msg_partitioner_murmur2,
        Partitioner::Consistent => rd::rd_kafka_msg_partitioner_consistent,
        Partitioner::Fnv1a => rd::rd_kafka_msg_partitioner_fnv1a,
    };
    assert!(count > 0, "a topic has partitions");
    // SAFETY: these three partitioners are pure functions of (key, keylen,
    // partition_cnt) (rdkafka_msg.c: `rd_murmur2(key, keylen) & 0x7fffffff
    // % partition_cnt`, `rd_crc32(...)`, `rd_fnv1a(...)`); they read
    // exactly `keylen` bytes of `key`, which `key.as_ptr()`/`key.len()`
    // describe, and never touch the topic or opaque pointers, so null is
    // fine for those. `count > 0` rules out a division by zero.
    unsafe {
        f(
            std::ptr::null(),
            key.as_ptr().cast(),
            key.len(),
            count,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_partitions_of_known_keys() {
        // Java's DefaultPartitioner (murmur2): Utils.toPositive(murmur2(
        // "a".getBytes())) % 4 etc., values from librdkafka's own unit test
        // (rdmurmur2.c: "kafka" -> 0xd067cf64) and CRC32 ("a" -> 0xe8b7be43).
        let m = |k: &str, n| partition_of(Partitioner::Murmur2, k.as_bytes(), n);
        assert_eq!(
            m("kafka", 1000),
            ((0xd067cf64u32 & 0x7fffffff) % 1000) as i32
        );
        let c = |k: &str, n| partition_of(Partitioner::Consistent, k.as_bytes(), n);
        assert_eq!(c("a", 1000), (0xe8b7be43u32 % 1000) as i32);
        for k in ["a", "bob", "x-17"] {
            for n in [1, 3, 8] {
                for p in [
                    Partitioner::Murmur2,
                    Partitioner::Consistent,
                    Partitioner::Fnv1a,
                ] {
                    let got = partition_of(p, k.as_bytes(), n);
                    assert!((0..n).contains(&got), "{p:?} {k} {n}: {got}");
                }
            }
        }
    }
}
