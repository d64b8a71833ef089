//! Shardings: how a tensor of an SPMD program is laid out over its devices,
//! and the HLO sharding attribute (`mhlo.sharding`) that tells XLA's SPMD
//! partitioner so.
//!
//! A [`Sharding`] is replicated (every device holds the whole tensor) or
//! tiled: some dimensions cut into equal parts, one tile per device, tiles
//! given to devices in row-major order. `{devices=[4,1]<=[4]}` cuts
//! dimension 0 of a matrix in four: device `d` holds rows `d·n/4 ..
//! (d+1)·n/4`. The devices form a 1-D mesh (the partitions of one program);
//! a 2-D mesh (data × model) would add a replicated tile dimension
//! (`last_tile_dim_replicate`) to the tiled form.
//!
//! Parts must divide their dimension: XLA would pad the last tile, and a
//! padded shard cannot be split from or gathered to a host array exactly.

use std::fmt;

use crate::dtype::{TensorType, element_count};
use crate::error::{Error, Result};

/// The layout of one tensor over the devices of an SPMD program.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sharding {
    /// `(dimension, parts)`, sorted by dimension, parts other than 1; empty
    /// when replicated.
    splits: Vec<(usize, usize)>,
}

impl Sharding {
    /// Every device holds the whole tensor.
    pub fn replicated() -> Sharding {
        Sharding { splits: Vec::new() }
    }

    /// Dimension `dim` cut into `parts` equal tiles, one per device.
    pub fn split(dim: usize, parts: usize) -> Sharding {
        Sharding::tiled(&[(dim, parts)])
    }

    /// Several dimensions cut at once: `(dimension, parts)` pairs; the
    /// product of the parts is the number of devices (tile `(i, j)` of a
    /// 2×2 tiling is on device `2i + j`).
    pub fn tiled(splits: &[(usize, usize)]) -> Sharding {
        let mut splits: Vec<(usize, usize)> = splits.iter().copied().filter(|&(_, parts)| parts != 1).collect();
        splits.sort_unstable();
        Sharding { splits }
    }

    /// Whether every device holds the whole tensor.
    pub fn is_replicated(&self) -> bool {
        self.splits.is_empty()
    }

    /// The devices a tiled sharding spans (the product of its parts);
    /// `None` when replicated, which fits any number.
    pub fn devices(&self) -> Option<usize> {
        (!self.is_replicated()).then(|| self.splits.iter().map(|&(_, parts)| parts).product())
    }

    /// Parts per dimension of a tensor of rank `rank`.
    fn tiles(&self, rank: usize) -> Vec<usize> {
        let mut tiles = vec![1; rank];
        for &(dim, parts) in &self.splits {
            if let Some(t) = tiles.get_mut(dim) {
                *t = parts;
            }
        }
        tiles
    }

    /// The HLO sharding text for a tensor of rank `rank`, as `mhlo.sharding`
    /// takes it: `{replicated}` or `{devices=[4,1]<=[4]}`.
    pub fn to_hlo(&self, rank: usize) -> String {
        match self.devices() {
            None => "{replicated}".to_string(),
            Some(devices) => {
                let tiles: Vec<String> = self.tiles(rank).iter().map(usize::to_string).collect();
                format!("{{devices=[{}]<=[{devices}]}}", tiles.join(","))
            }
        }
    }

    /// Reads the HLO sharding text grpo writes (`{replicated}`,
    /// `{devices=[4,1]<=[4]}`, or the device list spelt out in order,
    /// `{devices=[4,1]0,1,2,3}`); other layouts are an error naming them.
    pub(crate) fn from_hlo(text: &str) -> std::result::Result<Sharding, String> {
        let unsupported =
            || format!("sharding `{text}` is not supported: grpo reads {{replicated}} and {{devices=[…]<=[n]}}");
        let body = text.trim().strip_prefix('{').and_then(|t| t.strip_suffix('}'));
        let body = body.ok_or_else(unsupported)?.trim();
        if body == "replicated" {
            return Ok(Sharding::replicated());
        }
        let rest = body.strip_prefix("devices=[").ok_or_else(unsupported)?;
        let (tiles, devices) = rest.split_once(']').ok_or_else(unsupported)?;
        let tiles = tiles
            .split(',')
            .map(|t| t.trim().parse::<usize>().map_err(|_| unsupported()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let count: usize = tiles.iter().product();
        let in_order = match devices.trim().strip_prefix("<=[") {
            Some(iota) => iota.strip_suffix(']').map(str::trim) == Some(count.to_string().as_str()),
            None => {
                let ids: Vec<&str> = devices.split(',').map(str::trim).collect();
                ids.len() == count && ids.iter().enumerate().all(|(i, id)| *id == i.to_string())
            }
        };
        if !in_order {
            return Err(unsupported());
        }
        let splits: Vec<(usize, usize)> = tiles.into_iter().enumerate().collect();
        Ok(Sharding::tiled(&splits))
    }

    /// The shard each device holds of a tensor of type `ty` over `devices`
    /// devices, or the error saying why the sharding does not fit.
    pub fn shard_type(&self, ty: &TensorType, devices: usize) -> Result<TensorType> {
        self.shard_type_of("a tensor", ty, devices)
    }

    /// As [`Sharding::shard_type`], with `what` naming the tensor in the error.
    pub(crate) fn shard_type_of(&self, what: &str, ty: &TensorType, devices: usize) -> Result<TensorType> {
        let dims = self
            .shard_dims(&ty.dims, Some(devices))
            .map_err(|message| Error::Sharding {
                what: what.to_string(),
                ty: ty.clone(),
                sharding: self.to_hlo(ty.dims.len()),
                message,
            })?;
        Ok(TensorType::new(ty.dtype, dims))
    }

    /// Shard dimensions of `dims`, checking the split dimensions exist and
    /// divide evenly, and (if given) that the tiles fill `devices` devices.
    pub(crate) fn shard_dims(&self, dims: &[i64], devices: Option<usize>) -> std::result::Result<Vec<i64>, String> {
        if let (Some(tiles), Some(devices)) = (self.devices(), devices)
            && tiles != devices
        {
            return Err(format!("its tiles need {tiles} devices, not {devices}"));
        }
        let mut shard = dims.to_vec();
        for (i, &(dim, parts)) in self.splits.iter().enumerate() {
            if i > 0 && self.splits[i - 1].0 == dim {
                return Err(format!("dimension {dim} is split twice"));
            }
            let Some(size) = shard.get_mut(dim) else {
                return Err(format!("dimension {dim} does not exist (rank {})", dims.len()));
            };
            if parts == 0 {
                return Err(format!("dimension {dim} cannot be cut into 0 parts"));
            }
            let parts = parts as i64;
            if *size % parts != 0 {
                return Err(format!(
                    "dimension {dim} ({size}) does not divide into {parts} equal parts"
                ));
            }
            *size /= parts;
        }
        Ok(shard)
    }

    /// The whole type of which `shard` is one device's tile.
    pub(crate) fn whole_type(&self, shard: &TensorType) -> TensorType {
        let dims = shard
            .dims
            .iter()
            .zip(self.tiles(shard.dims.len()))
            .map(|(&d, parts)| d * parts as i64)
            .collect::<Vec<_>>();
        TensorType::new(shard.dtype, dims)
    }

    /// Cuts a row-major host array of dimensions `dims` into the shard of
    /// each of `devices` devices.
    pub fn shard_host<T: Copy>(&self, data: &[T], dims: &[i64], devices: usize) -> Result<Vec<Vec<T>>> {
        let layout = self.host_layout(dims, devices, data.len())?;
        Ok((0..devices)
            .map(|device| {
                let mut shard = Vec::with_capacity(layout.shard_len());
                layout.for_each_row(device, |whole, _, len| {
                    shard.extend_from_slice(&data[whole..whole + len])
                });
                shard
            })
            .collect())
    }

    /// Joins the shards of `shards.len()` devices into the row-major host
    /// array of dimensions `dims` (the first shard when replicated).
    pub fn gather_host<T: Copy>(&self, dims: &[i64], shards: &[Vec<T>]) -> Result<Vec<T>> {
        let layout = self.host_layout(dims, shards.len(), element_count(dims))?;
        if let Some(bad) = shards.iter().position(|s| s.len() != layout.shard_len()) {
            return Err(Error::HostLength {
                dims: layout.shard.clone(),
                expected: layout.shard_len(),
                found: shards[bad].len(),
            });
        }
        if self.is_replicated() {
            // Any copy is the whole array.
            return shards.first().cloned().ok_or_else(|| Error::HostLength {
                dims: dims.to_vec(),
                expected: element_count(dims),
                found: 0,
            });
        }
        // Tiled shards of an empty array have no elements to place.
        let Some(&seed) = shards.first().and_then(|s| s.first()) else {
            return Ok(Vec::new());
        };
        let mut whole_data = vec![seed; element_count(dims)];
        for (device, shard) in shards.iter().enumerate() {
            layout.for_each_row(device, |whole, part, len| {
                whole_data[whole..whole + len].copy_from_slice(&shard[part..part + len]);
            });
        }
        Ok(whole_data)
    }

    fn host_layout(&self, dims: &[i64], devices: usize, len: usize) -> Result<HostLayout> {
        let ty = TensorType::new(crate::dtype::ElementType::U8, dims);
        if len != ty.element_count() {
            return Err(Error::HostLength {
                dims: dims.to_vec(),
                expected: ty.element_count(),
                found: len,
            });
        }
        let shard = self.shard_type_of("a host array", &ty, devices)?.dims;
        Ok(HostLayout {
            whole: dims.to_vec(),
            tiles: self.tiles(dims.len()),
            shard,
        })
    }
}

impl fmt::Display for Sharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_replicated() {
            return f.write_str("replicated");
        }
        let splits: Vec<String> = self
            .splits
            .iter()
            .map(|(dim, parts)| format!("dimension {dim} in {parts}"))
            .collect();
        write!(f, "split {}", splits.join(", "))
    }
}

/// Where each device's tile lies in a row-major host array.
struct HostLayout {
    whole: Vec<i64>,
    tiles: Vec<usize>,
    shard: Vec<i64>,
}

impl HostLayout {
    fn shard_len(&self) -> usize {
        element_count(&self.shard)
    }

    /// Calls `f(whole_offset, shard_offset, len)` for each contiguous run of
    /// `device`'s tile, in row-major order (offsets in elements).
    fn for_each_row(&self, device: usize, mut f: impl FnMut(usize, usize, usize)) {
        let rank = self.whole.len();
        if rank == 0 {
            return f(0, 0, 1);
        }
        // The tile's coordinates: `device` unravelled over the tile grid, last dimension fastest.
        let mut start = vec![0usize; rank];
        let mut rest = device;
        for d in (0..rank).rev() {
            start[d] = (rest % self.tiles[d]) * self.shard[d] as usize;
            rest /= self.tiles[d];
        }
        let row = self.shard[rank - 1] as usize;
        let rows = element_count(&self.shard[..rank - 1]);
        if row == 0 {
            return;
        }
        let mut index = vec![0usize; rank - 1];
        for r in 0..rows {
            let mut offset = 0;
            for d in 0..rank {
                let at = start[d] + if d < rank - 1 { index[d] } else { 0 };
                offset = offset * self.whole[d] as usize + at;
            }
            f(offset, r * row, row);
            for d in (0..rank - 1).rev() {
                index[d] += 1;
                if index[d] < self.shard[d] as usize {
                    break;
                }
                index[d] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::ElementType;

    #[test]
    fn renders_and_reads_hlo_text() {
        assert_eq!(Sharding::replicated().to_hlo(2), "{replicated}");
        assert_eq!(Sharding::split(0, 4).to_hlo(2), "{devices=[4,1]<=[4]}");
        assert_eq!(Sharding::tiled(&[(1, 2), (0, 2)]).to_hlo(2), "{devices=[2,2]<=[4]}");
        for s in [
            Sharding::replicated(),
            Sharding::split(1, 4),
            Sharding::tiled(&[(0, 2), (2, 3)]),
        ] {
            assert_eq!(Sharding::from_hlo(&s.to_hlo(3)).unwrap(), s);
        }
        assert_eq!(
            Sharding::from_hlo("{devices=[1,4]0,1,2,3}").unwrap(),
            Sharding::split(1, 4)
        );
        assert_eq!(Sharding::split(0, 1), Sharding::replicated());
        for bad in [
            "{maximal device=0}",
            "{devices=[4,1]3,2,1,0}",
            "{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
        ] {
            assert!(Sharding::from_hlo(bad).unwrap_err().contains("not supported"), "{bad}");
        }
    }

    #[test]
    fn shard_types_need_even_splits_and_matching_devices() {
        let ty = TensorType::new(ElementType::F32, [8, 6]);
        let shard = Sharding::split(0, 4).shard_type(&ty, 4).unwrap();
        assert_eq!(shard.dims, [2, 6]);
        assert_eq!(Sharding::replicated().shard_type(&ty, 4).unwrap(), ty);
        let uneven = Sharding::split(1, 4).shard_type(&ty, 4).unwrap_err().to_string();
        assert!(uneven.contains("dimension 1 (6) does not divide into 4"), "{uneven}");
        let devices = Sharding::split(0, 2).shard_type(&ty, 4).unwrap_err().to_string();
        assert!(devices.contains("need 2 devices"), "{devices}");
        let rank = Sharding::split(2, 4).shard_type(&ty, 4).unwrap_err().to_string();
        assert!(rank.contains("does not exist"), "{rank}");
    }

    #[test]
    fn host_arrays_split_and_gather_back() {
        let dims = [4, 6];
        let data: Vec<i32> = (0..24).collect();
        let rows = Sharding::split(0, 2).shard_host(&data, &dims, 2).unwrap();
        assert_eq!(rows[1], (12..24).collect::<Vec<_>>());
        let grid = Sharding::tiled(&[(0, 2), (1, 3)]);
        let tiles = grid.shard_host(&data, &dims, 6).unwrap();
        // Device 4 = tile (1, 1): rows 2..4, columns 2..4.
        assert_eq!(tiles[4], [14, 15, 20, 21]);
        assert_eq!(grid.gather_host(&dims, &tiles).unwrap(), data);
        let copies = Sharding::replicated().shard_host(&data, &dims, 3).unwrap();
        assert!(copies.iter().all(|c| *c == data));
        assert_eq!(Sharding::replicated().gather_host(&dims, &copies).unwrap(), data);
        assert_eq!(
            Sharding::replicated().shard_host(&[7.0f32], &[], 2).unwrap(),
            [[7.0], [7.0]]
        );
        let short = Sharding::split(0, 2).gather_host(&dims, &rows[..1]).unwrap_err();
        assert!(short.to_string().contains("need 2 devices"), "{short}");
    }
}
