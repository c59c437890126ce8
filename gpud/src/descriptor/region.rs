//! Where a job's data may be: the arena segments gpud has mapped, and a
//! [`Region`], a run of elements proven to lie inside one of them (or a
//! device buffer's).

use crate::layout::{ElemType, Status, EC_ADDR_OFFSET_MASK, EC_ADDR_SEGMENT_SHIFT, EC_MAX_SEGMENTS};

/// The arena segments gpud has mapped, and their sizes: what addresses are
/// validated against. Segment 0 is the arena inside the first memfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentSizes {
    bytes: [u64; EC_MAX_SEGMENTS as usize],
    /// Bit i set: segment i is mapped.
    known: u64,
}

impl SegmentSizes {
    /// Only segment 0, of `arena_bytes`.
    pub fn single(arena_bytes: u64) -> SegmentSizes {
        let mut s = SegmentSizes {
            bytes: [0; EC_MAX_SEGMENTS as usize],
            known: 0,
        };
        s.set(0, arena_bytes);
        s
    }

    /// Records segment `seg` (< EC_MAX_SEGMENTS) of `bytes`.
    pub fn set(&mut self, seg: usize, bytes: u64) {
        self.bytes[seg] = bytes;
        self.known |= 1 << seg;
    }

    /// The size of segment `seg`, if it is mapped.
    pub fn get(&self, seg: usize) -> Option<u64> {
        (seg < EC_MAX_SEGMENTS as usize && self.known & (1 << seg) != 0).then(|| self.bytes[seg])
    }

    pub fn is_known(&self, seg: usize) -> bool {
        self.get(seg).is_some()
    }

    /// Segments mapped besides segment 0.
    pub fn extra(&self) -> u32 {
        (self.known & !1).count_ones()
    }
}

/// What validation checks addresses against: a plain `u64` is a lone
/// segment 0 of that many bytes (handy in tests).
pub trait Sizes {
    fn segment_bytes(&self, seg: usize) -> Option<u64>;
}

impl Sizes for u64 {
    fn segment_bytes(&self, seg: usize) -> Option<u64> {
        (seg == 0).then_some(*self)
    }
}

impl Sizes for &SegmentSizes {
    fn segment_bytes(&self, seg: usize) -> Option<u64> {
        self.get(seg)
    }
}

/// A validated run of elements in one arena segment: `len` elements of
/// `elem` bytes starting at byte `offset` of segment `seg`, with
/// `offset % elem == 0` and `offset + elem * len <=` the segment's size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Region {
    seg: u16,
    elem: u8,
    offset: u64,
    len: u32,
}

/// The segment number of a device buffer's region: no arena segment has it
/// (they stop at EC_MAX_SEGMENTS), and its offset is the buffer's address.
pub const BUFFER_SEG: u16 = u16::MAX;

impl Region {
    /// The region of a device buffer at `addr` (a device address on cuda, a
    /// host address on cpu). Only `buffers::Buffers` makes these, from its
    /// own live allocations, which outlive every launch that names them.
    pub(crate) fn buffer(addr: u64, len: u32, ty: ElemType) -> Region {
        Region { seg: BUFFER_SEG, elem: ty.bytes() as u8, offset: addr, len }
    }

    /// True for a device buffer's region (not in the arena).
    pub fn is_buffer(&self) -> bool {
        self.seg == BUFFER_SEG
    }

    /// The empty region; used for inputs a kernel does not read.
    pub const EMPTY: Region = Region {
        seg: 0,
        elem: 4,
        offset: 0,
        len: 0,
    };

    /// The arena segment the region lies in.
    pub fn segment(&self) -> usize {
        self.seg as usize
    }

    /// Byte offset from the start of its segment.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Bytes per element.
    pub fn elem_bytes(&self) -> u64 {
        u64::from(self.elem)
    }

    /// Bytes covered.
    pub fn bytes(&self) -> u64 {
        u64::from(self.len) * u64::from(self.elem)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One past the last byte. Cannot overflow: checked at validation.
    pub fn end(&self) -> u64 {
        self.offset + self.bytes()
    }

    /// True when both regions are non-empty and share at least one byte
    /// (of the same segment: different segments are different memory).
    pub fn overlaps(&self, other: &Region) -> bool {
        !self.is_empty()
            && !other.is_empty()
            && self.seg == other.seg
            && self.offset < other.end()
            && other.offset < self.end()
    }

    /// Checks an arena address and a count of `ty` elements against the
    /// segments.
    pub fn new(addr: u64, len: u32, ty: ElemType, sizes: impl Sizes) -> Result<Region, Status> {
        let elem = ty.bytes();
        let seg = (addr >> EC_ADDR_SEGMENT_SHIFT) as usize;
        // A segment gpud has not mapped names memory it does not have.
        let seg_bytes = sizes.segment_bytes(seg).ok_or(Status::OutOfBounds)?;
        let offset = addr & EC_ADDR_OFFSET_MASK;
        if !offset.is_multiple_of(elem) {
            return Err(Status::Misaligned);
        }
        let end = u64::from(len)
            .checked_mul(elem)
            .and_then(|bytes| offset.checked_add(bytes))
            .ok_or(Status::OutOfBounds)?;
        if end > seg_bytes {
            return Err(Status::OutOfBounds);
        }
        Ok(Region {
            seg: seg as u16,
            elem: elem as u8,
            offset,
            len,
        })
    }
}

