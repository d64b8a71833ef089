//! Gather, scatter-add, scatter, take, take_along_axis, cumsum, argmax and argmin:
//! forward values against host loops, gradients against finite
//! differences, and shape errors while tracing.

mod common;

use common::check::{Input, check_forward, check_gradient};
use common::cpu_client;
use grpo_xla::ElementType;
use grpo_xla::trace::{GatherDims, Graph, ScatterDims, Tensor};

/// The product of `dims`.
fn size(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// `numpy.take(x, ids, axis)` for row-major `x` of `dims`.
fn host_take(x: &[f64], dims: &[usize], ids: &[i32], axis: usize) -> Vec<f64> {
    let (outer, n, inner) = (size(&dims[..axis]), dims[axis], size(&dims[axis + 1..]));
    let mut out = Vec::new();
    for o in 0..outer {
        for &id in ids {
            for i in 0..inner {
                out.push(x[(o * n + id as usize) * inner + i]);
            }
        }
    }
    out
}

/// `numpy.take_along_axis(x, ids, axis)`; `ids` has `x`'s dimensions but
/// `m` along `axis`.
fn host_take_along_axis(x: &[f64], dims: &[usize], ids: &[i32], m: usize, axis: usize) -> Vec<f64> {
    let (outer, n, inner) = (size(&dims[..axis]), dims[axis], size(&dims[axis + 1..]));
    let mut out = Vec::new();
    for o in 0..outer {
        for j in 0..m {
            for i in 0..inner {
                let id = ids[(o * m + j) * inner + i] as usize;
                out.push(x[(o * n + id) * inner + i]);
            }
        }
    }
    out
}

/// Cumulative sums along `axis` of row-major `x` of `dims`.
fn host_cumsum(x: &[f64], dims: &[usize], axis: usize, reverse: bool) -> Vec<f64> {
    let (outer, n, inner) = (size(&dims[..axis]), dims[axis], size(&dims[axis + 1..]));
    let mut out = x.to_vec();
    for o in 0..outer {
        for i in 0..inner {
            let mut total = 0.0;
            let order: Vec<usize> = if reverse {
                (0..n).rev().collect()
            } else {
                (0..n).collect()
            };
            for j in order {
                let at = (o * n + j) * inner + i;
                total += x[at];
                out[at] = total;
            }
        }
    }
    out
}

/// Index of the first largest (or smallest) element along the last axis.
fn host_arg_extreme(x: &[f64], n: usize, smallest: bool) -> Vec<f64> {
    x.chunks(n)
        .map(|row| {
            let mut best = 0;
            for (j, &v) in row.iter().enumerate() {
                if (smallest && v < row[best]) || (!smallest && v > row[best]) {
                    best = j;
                }
            }
            best as f64
        })
        .collect()
}

/// An `i32` constant in the graph of `like`.
fn ids(like: &Tensor, values: &[i32], dims: &[i64]) -> grpo_xla::Result<Tensor> {
    like.graph().constant(values, dims)
}

#[test]
fn take_on_axis_0_is_an_embedding_lookup_whose_gradient_accumulates() {
    let client = cpu_client(1);
    // Ids repeat (1 three times), so the table's gradient must sum rows.
    let id_values = [1, 4, 1, 0, 1, 3];
    let table = [Input::new(&[5, 3])];
    let lookup = |p: &[Tensor]| {
        let out = p[0].take(&ids(&p[0], &id_values, &[2, 3])?, 0)?;
        assert_eq!(out.dims(), [2, 3, 3]);
        Ok(out)
    };
    check_forward(
        &client,
        &table,
        lookup,
        |v| host_take(&v[0], &[5, 3], &id_values, 0),
        0.0,
    );
    check_gradient(&client, &table, lookup);
}

#[test]
fn take_on_a_middle_axis() {
    let client = cpu_client(1);
    let id_values = [3, 0, 3, 2];
    let x = [Input::new(&[3, 4, 2])];
    let take = |p: &[Tensor]| {
        let out = p[0].take(&ids(&p[0], &id_values, &[2, 2])?, 1)?;
        assert_eq!(out.dims(), [3, 2, 2, 2]);
        Ok(out)
    };
    check_forward(&client, &x, take, |v| host_take(&v[0], &[3, 4, 2], &id_values, 1), 0.0);
    check_gradient(&client, &x, take);
}

#[test]
fn take_along_the_last_axis_picks_one_logit_per_position() {
    let client = cpu_client(1);
    let logits = [Input::new(&[2, 3, 5])];
    // One id per position, as for token log-probabilities.
    let one = [4, 0, 2, 2, 1, 4];
    let pick = |p: &[Tensor]| {
        let out = p[0].take_along_axis(&ids(&p[0], &one, &[2, 3, 1])?, 2)?;
        assert_eq!(out.dims(), [2, 3, 1]);
        Ok(out)
    };
    check_forward(
        &client,
        &logits,
        pick,
        |v| host_take_along_axis(&v[0], &[2, 3, 5], &one, 1, 2),
        0.0,
    );
    check_gradient(&client, &logits, pick);
    // Narrow u8 ids give the same picks.
    let narrow: Vec<u8> = one.iter().map(|&i| i as u8).collect();
    check_forward(
        &client,
        &logits,
        |p| p[0].take_along_axis(&p[0].graph().constant(&narrow, &[2, 3, 1])?, 2),
        |v| host_take_along_axis(&v[0], &[2, 3, 5], &one, 1, 2),
        0.0,
    );
    // Two ids per position, repeated, along a middle axis.
    let two = [0, 2, 2, 2, 1, 0, 1, 1, 0, 0, 2, 1, 0, 1, 2, 2, 1, 1, 0, 0];
    let pick_two = |p: &[Tensor]| p[0].take_along_axis(&ids(&p[0], &two, &[2, 2, 5])?, 1);
    check_forward(
        &client,
        &logits,
        pick_two,
        |v| host_take_along_axis(&v[0], &[2, 3, 5], &two, 2, 1),
        0.0,
    );
    check_gradient(&client, &logits, pick_two);
}

#[test]
fn general_gather_of_overlapping_windows() {
    let client = cpu_client(1);
    // Index vectors along dimension 0 of [2, 3]: three (row, column) starts
    // of 2×3 windows of a 4×5 operand, two of them overlapping.
    let starts = [0, 2, 1, 1, 2, 0];
    let dims = GatherDims {
        offset_dims: vec![1, 2],
        collapsed_slice_dims: vec![],
        start_index_map: vec![0, 1],
        index_vector_dim: 0,
    };
    let x = [Input::new(&[4, 5])];
    let gather = |p: &[Tensor]| {
        let out = p[0].gather(&ids(&p[0], &starts, &[2, 3])?, &dims, &[2, 3])?;
        assert_eq!(out.dims(), [3, 2, 3]);
        Ok(out)
    };
    let host = |v: &[Vec<f64>]| {
        let mut out = Vec::new();
        for b in 0..3 {
            let (row, column) = (starts[b] as usize, starts[3 + b] as usize);
            for r in 0..2 {
                for c in 0..3 {
                    out.push(v[0][(row + r) * 5 + column + c]);
                }
            }
        }
        out
    };
    check_forward(&client, &x, gather, host, 0.0);
    check_gradient(&client, &x, gather);
}

/// Scatter dimensions writing rows of a `[rows, 3]` operand, one index per row.
fn row_windows() -> ScatterDims {
    ScatterDims {
        update_window_dims: vec![1],
        inserted_window_dims: vec![0],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: 1,
    }
}

#[test]
fn scatter_add_accumulates_repeated_indices() {
    let client = cpu_client(1);
    let rows = [1, 3, 1, 4];
    let dims = row_windows();
    let inputs = [Input::new(&[5, 3]), Input::new(&[4, 3])];
    let scatter = |p: &[Tensor]| p[0].scatter_add(&ids(&p[0], &rows, &[4])?, &p[1], &dims);
    let host = |v: &[Vec<f64>]| {
        let mut out = v[0].clone();
        for (k, &row) in rows.iter().enumerate() {
            for d in 0..3 {
                out[row as usize * 3 + d] += v[1][k * 3 + d];
            }
        }
        out
    };
    check_forward(&client, &inputs, scatter, host, 1e-12);
    check_gradient(&client, &inputs, scatter);
}

#[test]
fn scatter_overwrites_windows_and_skips_out_of_range_ones() {
    let client = cpu_client(1);
    // Rows 3 and 0 are overwritten; −1 and 5 fall outside and write nothing.
    let rows = [3, -1, 0, 5];
    let dims = row_windows();
    let inputs = [Input::new(&[5, 3]), Input::new(&[4, 3])];
    let scatter = |p: &[Tensor]| p[0].scatter(&ids(&p[0], &rows, &[4])?, &p[1], &dims);
    let host = |v: &[Vec<f64>]| {
        let mut out = v[0].clone();
        for (k, &row) in rows.iter().enumerate() {
            if (0..5).contains(&row) {
                out[row as usize * 3..row as usize * 3 + 3].copy_from_slice(&v[1][k * 3..k * 3 + 3]);
            }
        }
        out
    };
    check_forward(&client, &inputs, scatter, host, 0.0);
    // Gradients match for in-range, distinct windows (see the module's doc).
    let rows = [3, 1, 0, 4];
    let scatter = |p: &[Tensor]| p[0].scatter(&ids(&p[0], &rows, &[4])?, &p[1], &dims);
    check_gradient(&client, &inputs, scatter);
}

#[test]
fn cumsum_forward_and_reverse() {
    let client = cpu_client(1);
    for (dims, axis) in [(&[3usize, 4][..], 1), (&[3, 4], 0), (&[2, 3, 4], 1), (&[6], 0)] {
        let shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let x = [Input::new(&shape)];
        for reverse in [false, true] {
            check_forward(
                &client,
                &x,
                |p| p[0].cumsum(axis, reverse),
                |v| host_cumsum(&v[0], dims, axis, reverse),
                1e-12,
            );
            check_gradient(&client, &x, |p| p[0].cumsum(axis, reverse));
        }
    }
}

#[test]
fn argmax_and_argmin_take_the_first_of_ties() {
    let client = cpu_client(1);
    // Floors of [0, 3) tie often; the index output converts to f64 to compare.
    let x = [Input::range(&[4, 6], 0.0, 3.0)];
    for smallest in [false, true] {
        check_forward(
            &client,
            &x,
            |p| {
                let floor = p[0].floor()?;
                let index = if smallest {
                    floor.argmin(1, ElementType::S32)?
                } else {
                    floor.argmax(1, ElementType::S32)?
                };
                assert_eq!(index.dims(), [4]);
                index.convert(ElementType::F64)
            },
            |v| {
                let floor: Vec<f64> = v[0].iter().map(|x| x.floor()).collect();
                host_arg_extreme(&floor, 6, smallest)
            },
            0.0,
        );
    }
    // Along the first axis of a rank-3 tensor.
    check_forward(
        &client,
        &[Input::new(&[5, 2, 3])],
        |p| {
            p[0].transpose(&[1, 2, 0])?
                .argmax(2, ElementType::S32)?
                .convert(ElementType::F64)
        },
        |v| {
            let mut moved = vec![0.0; 30];
            for (i, &value) in v[0].iter().enumerate() {
                moved[(i % 6) * 5 + i / 6] = value;
            }
            host_arg_extreme(&moved, 5, false)
        },
        0.0,
    );
    check_forward(
        &client,
        &[Input::new(&[5, 2, 3])],
        |p| {
            let direct = p[0].argmax(0, ElementType::S32)?;
            let moved = p[0].transpose(&[1, 2, 0])?.argmax(2, ElementType::S32)?;
            direct.sub(&moved)?.convert(ElementType::F64)
        },
        |_| vec![0.0; 6],
        0.0,
    );
}

#[test]
fn argmax_exact_ties_nans_and_s64_indices() {
    let client = cpu_client(1);
    let graph = Graph::new("argmax_exact");
    let nan = f32::NAN;
    let x = graph
        .constant(
            &[1.0f32, 3.0, 3.0, 0.0, nan, 2.0, nan, 5.0, -1.0, -1.0, -1.0, -1.0],
            &[3, 4],
        )
        .unwrap();
    let max = x.argmax(1, ElementType::S32).unwrap();
    let min = x.argmin(1, ElementType::S32).unwrap();
    let wide = x.argmax(0, ElementType::S64).unwrap();
    let executable = graph.build(&[&max, &min, &wide]).unwrap().compile(&client).unwrap();
    let out = executable.execute(&[]).unwrap();
    assert_eq!(out[0].to_host::<i32>().unwrap(), [1, 0, 0]);
    assert_eq!(out[1].to_host::<i32>().unwrap(), [3, 0, 0]);
    assert_eq!(out[2].to_host::<i64>().unwrap(), [1, 0, 1, 1]);
}

#[test]
fn argmax_past_the_exact_floats_of_f32_finds_the_index() {
    // 2^24 + 1 is the first index an f32 cannot hold: the long axis counts
    // positions in f64.
    let n = (1usize << 24) + 3;
    let client = cpu_client(1);
    let graph = Graph::new("argmax_long");
    let x = graph.parameter(ElementType::F32, &[n as i64]).unwrap();
    let (max, min) = (
        x.argmax(0, ElementType::S64).unwrap(),
        x.argmin(0, ElementType::S32).unwrap(),
    );
    let executable = graph.build(&[&max, &min]).unwrap().compile(&client).unwrap();
    let mut values = vec![0.5f32; n];
    values[(1 << 24) + 1] = 2.0;
    values[(1 << 24) + 2] = -1.0;
    let input = client
        .buffer_from_host(&values, &[n as i64], client.device(0).unwrap())
        .unwrap();
    let out = executable.execute(&[&input]).unwrap();
    assert_eq!(out[0].to_host::<i64>().unwrap(), [(1 << 24) + 1]);
    assert_eq!(out[1].to_host::<i32>().unwrap(), [(1 << 24) + 2]);
}

#[test]
fn gradient_flows_through_the_gathered_maximum_not_the_argmax() {
    let client = cpu_client(1);
    check_gradient(&client, &[Input::new(&[2, 3, 5])], |p| {
        let best = p[0].argmax(2, ElementType::S32)?.reshape(&[2, 3, 1])?;
        p[0].take_along_axis(&best, 2)
    });
}

#[test]
fn mismatched_shapes_are_refused_while_tracing() {
    let graph = Graph::new("bad");
    let table = graph.parameter(ElementType::F32, &[5, 3]).unwrap();
    let ids_2x2 = graph.constant(&[0i32, 1, 2, 3], &[2, 2]).unwrap();

    let error = table.take_along_axis(&ids_2x2, 1).unwrap_err().to_string();
    assert!(
        error.starts_with("take_along_axis") && error.contains("[2, 2]") && error.contains("[5, 3]"),
        "{error}"
    );

    let float_ids = graph.parameter(ElementType::F32, &[2]).unwrap();
    let error = table.take(&float_ids, 0).unwrap_err().to_string();
    assert!(error.starts_with("gather") && error.contains("integers"), "{error}");

    let dims = GatherDims {
        offset_dims: vec![1],
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        index_vector_dim: 2,
    };
    let error = table.gather(&ids_2x2, &dims, &[1, 4]).unwrap_err().to_string();
    assert!(error.starts_with("gather") && error.contains("slice_sizes"), "{error}");

    let dims = row_windows();
    let rows = graph.constant(&[0i32, 1, 2, 3], &[4]).unwrap();
    let updates = graph.parameter(ElementType::F32, &[3, 3]).unwrap();
    let error = table.scatter_add(&rows, &updates, &dims).unwrap_err().to_string();
    assert!(
        error.starts_with("scatter_add") && error.contains("[3]") && error.contains("[4]"),
        "{error}"
    );

    let error = table.argmax(1, ElementType::F32).unwrap_err().to_string();
    assert!(error.starts_with("argmax") && error.contains("f32"), "{error}");
    let error = table.argmin(2, ElementType::S32).unwrap_err().to_string();
    assert!(error.starts_with("argmin"), "{error}");
    let error = table.cumsum(2, false).unwrap_err().to_string();
    assert!(error.starts_with("cumsum") && error.contains("axis 2"), "{error}");
}
