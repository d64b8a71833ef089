//! How a sparse layer's experts are laid out in checkpoints.
//!
//! The decoder holds each expert projection of a layer as one stacked
//! tensor, `model.layers.N.mlp.experts.{gate_proj, up_proj}` `[experts,
//! moe_intermediate, hidden]` and `…experts.down_proj` `[experts, hidden,
//! moe_intermediate]`, so its grouped product can pick any expert's
//! matrix. Checkpoints on the Hub (and what transformers' `save_pretrained`
//! writes) hold one tensor per expert instead,
//! `model.layers.N.mlp.experts.E.gate_proj.weight` `[moe_intermediate,
//! hidden]` and so on; transformers 5 holds gate and up fused in memory
//! (`…experts.gate_up_proj` `[experts, 2·moe_intermediate, hidden]`, gate
//! first). [`stacked_tensor`] reads a stacked tensor from any of these;
//! [`hub_layout`] writes the Hub's.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::weights::HostTensor;

/// The projections an expert has, as the stacked tensors name them.
const PROJECTIONS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// `(model.layers.N.mlp.experts, projection)` of a stacked expert tensor's
/// name (`model.layers.N.mlp.experts.gate_proj`), or `None` for other names.
fn stacked_parts(name: &str) -> Option<(&str, &str)> {
    let (prefix, projection) = name.rsplit_once('.')?;
    (prefix.ends_with(".mlp.experts") && PROJECTIONS.contains(&projection)).then_some((prefix, projection))
}

/// The stacked expert tensor `name` assembled from what a checkpoint holds:
/// `read(name)` gives a tensor the checkpoint has under that name (`None`
/// when it has none). Tries the one-tensor-per-expert layout (experts
/// 0, 1, … while they are there), then transformers 5's fused
/// `gate_up_proj` for the gate and up projections. `None` when `name` is
/// not a stacked expert name or neither layout is there.
pub fn stacked_tensor(name: &str, read: impl Fn(&str) -> Option<Result<HostTensor>>) -> Option<Result<HostTensor>> {
    let (prefix, projection) = stacked_parts(name)?;
    let mut experts = Vec::new();
    while let Some(tensor) = read(&format!("{prefix}.{}.{projection}.weight", experts.len())) {
        match tensor {
            Ok(t) => experts.push(t),
            Err(e) => return Some(Err(e)),
        }
    }
    if !experts.is_empty() {
        return Some(stack(name, &experts));
    }
    let half = match projection {
        "gate_proj" => 0,
        "up_proj" => 1,
        _ => return None,
    };
    let fused = read(&format!("{prefix}.gate_up_proj"))?;
    Some(fused.and_then(|t| half_rows(name, &t, half)))
}

/// `experts` (each `[out, in]`, the same shape) as one `[count, out, in]` tensor.
fn stack(name: &str, experts: &[HostTensor]) -> Result<HostTensor> {
    let dims = &experts[0].dims;
    if let Some((index, other)) = experts
        .iter()
        .enumerate()
        .find(|(_, t)| &t.dims != dims || t.dims.len() != 2)
    {
        return Err(Error::format(
            name,
            format!("expert {index} has shape {:?}, expert 0 {dims:?}", other.dims),
        ));
    }
    let data: Vec<f32> = experts.iter().flat_map(|t| t.data.iter().copied()).collect();
    HostTensor::new([vec![experts.len()], dims.clone()].concat(), data)
}

/// Rows `half·n..(half+1)·n` of each expert of a fused `[experts, 2n, in]` tensor.
fn half_rows(name: &str, fused: &HostTensor, half: usize) -> Result<HostTensor> {
    let &[experts, rows, cols] = fused.dims.as_slice() else {
        return Err(Error::format(name, format!("gate_up_proj has shape {:?}", fused.dims)));
    };
    if rows % 2 != 0 {
        return Err(Error::format(name, format!("gate_up_proj has an odd row count {rows}")));
    }
    let n = rows / 2;
    let data: Vec<f32> = (0..experts)
        .flat_map(|e| {
            let start = (e * rows + half * n) * cols;
            fused.data[start..start + n * cols].iter().copied()
        })
        .collect();
    HostTensor::new(vec![experts, n, cols], data)
}

/// `tensors` in the Hub's layout: every stacked expert tensor split into
/// one `…experts.E.{projection}.weight` per expert, the rest as they are
/// (borrowed). Saving a model so holds one extra copy of its experts.
pub fn hub_layout(tensors: &BTreeMap<String, HostTensor>) -> Result<BTreeMap<String, Cow<'_, HostTensor>>> {
    let mut out = BTreeMap::new();
    for (name, tensor) in tensors {
        let Some((prefix, projection)) = stacked_parts(name) else {
            out.insert(name.clone(), Cow::Borrowed(tensor));
            continue;
        };
        let &[experts, rows, cols] = tensor.dims.as_slice() else {
            return Err(Error::format(
                name,
                format!("a stacked expert tensor has shape {:?}", tensor.dims),
            ));
        };
        for (e, values) in tensor.data.chunks_exact(rows * cols).take(experts).enumerate() {
            let expert = HostTensor::new(vec![rows, cols], values.to_vec())?;
            out.insert(format!("{prefix}.{e}.{projection}.weight"), Cow::Owned(expert));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(dims: &[usize], start: f32) -> HostTensor {
        let count = dims.iter().product();
        HostTensor::new(dims.to_vec(), (0..count).map(|i| start + i as f32).collect()).unwrap()
    }

    #[test]
    fn per_expert_tensors_stack_and_split_back() {
        let mut hub = BTreeMap::new();
        for e in 0..3 {
            for (p, projection) in PROJECTIONS.iter().enumerate() {
                let dims = if p == 2 { [4, 2] } else { [2, 4] };
                let name = format!("model.layers.1.mlp.experts.{e}.{projection}.weight");
                hub.insert(name, tensor(&dims, (100 * e + 10 * p) as f32));
            }
        }
        let read = |name: &str| hub.get(name).cloned().map(Ok);
        let mut stacked = BTreeMap::new();
        for projection in PROJECTIONS {
            let name = format!("model.layers.1.mlp.experts.{projection}");
            let t = stacked_tensor(&name, read).unwrap().unwrap();
            stacked.insert(name, t);
        }
        let up = &stacked["model.layers.1.mlp.experts.up_proj"];
        assert_eq!(up.dims, [3, 2, 4]);
        assert_eq!(up.data[8], 110.0, "expert 1 starts after expert 0's 8 values");
        let back = hub_layout(&stacked).unwrap();
        assert_eq!(back.len(), hub.len());
        for (name, t) in &hub {
            assert_eq!(back[name].as_ref(), t, "{name}");
        }
        assert!(stacked_tensor("model.layers.1.mlp.down_proj", read).is_none());
    }

    #[test]
    fn transformers_fused_gate_up_splits_in_halves() {
        let fused = tensor(&[2, 4, 3], 0.0);
        let read = |name: &str| (name == "model.layers.0.mlp.experts.gate_up_proj").then(|| Ok(fused.clone()));
        let gate = stacked_tensor("model.layers.0.mlp.experts.gate_proj", read)
            .unwrap()
            .unwrap();
        let up = stacked_tensor("model.layers.0.mlp.experts.up_proj", read)
            .unwrap()
            .unwrap();
        assert_eq!((gate.dims.clone(), up.dims.clone()), (vec![2, 2, 3], vec![2, 2, 3]));
        assert_eq!(gate.data[..6], fused.data[..6]);
        assert_eq!(up.data[..6], fused.data[6..12]);
        assert_eq!(gate.data[6..], fused.data[12..18]);
        assert!(stacked_tensor("model.layers.0.mlp.experts.down_proj", read).is_none());
    }
}
