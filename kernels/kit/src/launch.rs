//! Launches over dimensions: how a kernel maps its virtual blocks (the
//! `block` a `kernel!` or `table!` GPU body gets, counted within its job)
//! and its threads onto rows, parts of rows and 2-D tiles. Plain integer
//! arithmetic, the same on both targets, so a CPU body can walk the same
//! tiles and the host tests check the mapping.
//!
//! erlcuda launches are one-dimensional (`(grid, 1, 1)` × `(threads, 1,
//! 1)`, grid-stride over virtual blocks), so a second dimension is an index
//! computed from the block number: [`Tiles`] and [`RowParts`] give it, and
//! [`thread_2d`] views a block's threads as a `width`-wide rectangle.
//! Kernels launched with a real y dimension (outside erlcuda's job table)
//! read it with [`crate::device::thread_idx_y`] and its siblings.

/// `ceil(n / d)`, `d > 0`.
#[inline(always)]
pub const fn div_ceil(n: u64, d: u64) -> u64 {
    n.div_ceil(d)
}

/// Rows of `cols` elements, each split into `parts` parts of at most
/// `per_block` elements, one block each: blocks `row · parts + part`.
/// With `per_block >= cols` it is one block per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowParts {
    pub cols: u64,
    pub per_block: u64,
    pub parts: u64,
}

impl RowParts {
    /// `per_block > 0`; a row of 0 columns still takes one block.
    #[inline(always)]
    pub const fn new(cols: u64, per_block: u64) -> Self {
        let parts = div_ceil(cols, per_block);
        RowParts { cols, per_block, parts: if parts == 0 { 1 } else { parts } }
    }

    /// Blocks for `rows` rows.
    #[inline(always)]
    pub const fn blocks(&self, rows: u64) -> u64 {
        rows * self.parts
    }

    /// `(row, part)` of block `b`.
    #[inline(always)]
    pub const fn of(&self, b: u64) -> (u64, u64) {
        (b / self.parts, b % self.parts)
    }

    /// Columns `lo..hi` of part `part` of a row.
    #[inline(always)]
    pub const fn span(&self, part: u64) -> (u64, u64) {
        let lo = part * self.per_block;
        let hi = lo + self.per_block;
        (if lo < self.cols { lo } else { self.cols }, if hi < self.cols { hi } else { self.cols })
    }
}

/// A `rows × cols` matrix cut into tiles of `tile_rows × tile_cols`, one
/// block each, numbered row-major: block `b` is tile `(b / across, b %
/// across)`. Edge tiles are clipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiles {
    pub rows: u64,
    pub cols: u64,
    pub tile_rows: u64,
    pub tile_cols: u64,
}

impl Tiles {
    /// Tile sizes > 0.
    #[inline(always)]
    pub const fn new(rows: u64, cols: u64, tile_rows: u64, tile_cols: u64) -> Self {
        Tiles { rows, cols, tile_rows, tile_cols }
    }

    /// Tiles across a row of tiles.
    #[inline(always)]
    pub const fn across(&self) -> u64 {
        div_ceil(self.cols, self.tile_cols)
    }

    /// Rows of tiles.
    #[inline(always)]
    pub const fn down(&self) -> u64 {
        div_ceil(self.rows, self.tile_rows)
    }

    /// Blocks: every tile.
    #[inline(always)]
    pub const fn count(&self) -> u64 {
        self.across() * self.down()
    }

    /// `(tile row, tile column)` of block `b`.
    #[inline(always)]
    pub const fn of(&self, b: u64) -> (u64, u64) {
        let a = self.across();
        (b / a, b % a)
    }

    /// The element rows `r0..r1` and columns `c0..c1` block `b` covers.
    #[inline(always)]
    pub const fn bounds(&self, b: u64) -> ((u64, u64), (u64, u64)) {
        let (tr, tc) = self.of(b);
        let (r0, c0) = (tr * self.tile_rows, tc * self.tile_cols);
        let (r1, c1) = (r0 + self.tile_rows, c0 + self.tile_cols);
        (
            (r0, if r1 < self.rows { r1 } else { self.rows }),
            (c0, if c1 < self.cols { c1 } else { self.cols }),
        )
    }
}

/// Thread `t` of a block viewed as rows of `width` threads: `(x, y)` =
/// `(t % width, t / width)`.
#[inline(always)]
pub const fn thread_2d(t: u32, width: u32) -> (u32, u32) {
    (t % width, t / width)
}

/// The indices `lo + t, lo + t + nt, …` below `hi`: thread `t` of `nt`
/// striding through `lo..hi` (coalesced: neighbouring threads, neighbouring
/// elements).
#[inline(always)]
pub fn strided(lo: u64, hi: u64, t: u64, nt: u64) -> impl Iterator<Item = u64> {
    (lo + t..hi).step_by(nt as usize)
}
