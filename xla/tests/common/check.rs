//! Checks for traced ops: forward values against host references, and
//! gradients against central finite differences, all in f64 on real XLA.

use grpo_xla::trace::{Graph, Tensor, grad};
use grpo_xla::{Client, ElementType, Executable, NativeType, Result};

/// One f64 input: its shape and the range its random values come from.
#[derive(Debug, Clone)]
pub struct Input {
    /// Dimensions.
    pub dims: Vec<i64>,
    /// Smallest value.
    pub low: f64,
    /// Largest value.
    pub high: f64,
}

impl Input {
    /// Values uniform in [-1, 1).
    pub fn new(dims: &[i64]) -> Input {
        Input::range(dims, -1.0, 1.0)
    }

    /// Values uniform in [low, high).
    pub fn range(dims: &[i64], low: f64, high: f64) -> Input {
        Input {
            dims: dims.to_vec(),
            low,
            high,
        }
    }

    fn count(&self) -> usize {
        self.dims.iter().product::<i64>() as usize
    }

    fn sample(&self) -> Vec<f64> {
        super::random_in(self.count(), self.low, self.high)
    }
}

/// Runs `executable` on f64 inputs, returning every output as f64.
pub fn run_f64(client: &Client, executable: &Executable, inputs: &[(Vec<f64>, Vec<i64>)]) -> Vec<Vec<f64>> {
    run(client, executable, inputs)
}

/// Runs `executable` on inputs of one element type, returning every output as that type.
pub fn run<T: NativeType>(client: &Client, executable: &Executable, inputs: &[(Vec<T>, Vec<i64>)]) -> Vec<Vec<T>> {
    let device = client.device(0).unwrap();
    let buffers: Vec<_> = inputs
        .iter()
        .map(|(data, dims)| client.buffer_from_host(data, dims, device).unwrap())
        .collect();
    let refs: Vec<_> = buffers.iter().collect();
    executable
        .execute(&refs)
        .unwrap()
        .iter()
        .map(|b| b.to_host::<T>().unwrap())
        .collect()
}

/// Builds `f` over f64 parameters of `inputs`, runs it on random values and
/// compares the (single) output with `reference` on the same values.
pub fn check_forward(
    client: &Client,
    inputs: &[Input],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    reference: impl Fn(&[Vec<f64>]) -> Vec<f64>,
    tolerance: f64,
) {
    let graph = Graph::new("forward");
    let params: Vec<Tensor> = inputs
        .iter()
        .map(|i| graph.parameter(ElementType::F64, &i.dims).unwrap())
        .collect();
    let out = f(&params).unwrap();
    let executable = graph.build(&[&out]).unwrap().compile(client).unwrap();
    let values: Vec<Vec<f64>> = inputs.iter().map(Input::sample).collect();
    let feed: Vec<(Vec<f64>, Vec<i64>)> = values
        .iter()
        .cloned()
        .zip(inputs.iter().map(|i| i.dims.clone()))
        .collect();
    let got = run_f64(client, &executable, &feed).remove(0);
    let want = reference(&values);
    assert_eq!(got.len(), want.len(), "output sizes differ");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance * w.abs().max(1.0),
            "element {i}: got {g}, want {w} (inputs {values:?})"
        );
    }
}

/// Checks the gradient of `sum(f(x) * w)` (w random, fixed) with respect to
/// every input against central finite differences of the same program.
pub fn check_gradient(client: &Client, inputs: &[Input], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let (forward, backward) = gradient_programs(client, inputs, &f);
    let values: Vec<Vec<f64>> = inputs.iter().map(Input::sample).collect();
    let dims: Vec<Vec<i64>> = inputs.iter().map(|i| i.dims.clone()).collect();
    let feed = |values: &[Vec<f64>]| -> Vec<(Vec<f64>, Vec<i64>)> {
        values.iter().cloned().zip(dims.iter().cloned()).collect()
    };
    let analytic = run_f64(client, &backward, &feed(&values));
    let h = 1e-6;
    for (which, input) in values.iter().enumerate() {
        for element in 0..input.len() {
            let mut plus = values.clone();
            plus[which][element] += h;
            let mut minus = values.clone();
            minus[which][element] -= h;
            let up = run_f64(client, &forward, &feed(&plus))[0][0];
            let down = run_f64(client, &forward, &feed(&minus))[0][0];
            let numeric = (up - down) / (2.0 * h);
            let got = analytic[1 + which][element];
            assert!(
                (got - numeric).abs() <= 1e-6 * numeric.abs().max(1.0),
                "d/d input {which}[{element}]: autodiff {got}, finite differences {numeric} (inputs {values:?})"
            );
        }
    }
}

/// The forward program (loss) and the backward program (loss, grads…).
fn gradient_programs(
    client: &Client,
    inputs: &[Input],
    f: &impl Fn(&[Tensor]) -> Result<Tensor>,
) -> (Executable, Executable) {
    let weights = std::cell::RefCell::new(None::<Vec<f64>>);
    let build = |with_grad: bool| -> Executable {
        let graph = Graph::new(if with_grad { "backward" } else { "forward" });
        let params: Vec<Tensor> = inputs
            .iter()
            .map(|i| graph.parameter(ElementType::F64, &i.dims).unwrap())
            .collect();
        let out = f(&params).unwrap();
        let count = out.tensor_type().element_count();
        let w = weights
            .borrow_mut()
            .get_or_insert_with(|| Input::new(&[count as i64]).sample())
            .clone();
        let w = graph.constant(&w, out.dims()).unwrap();
        let loss = out.mul(&w).unwrap().sum_all().unwrap();
        let mut outputs = vec![loss.clone()];
        if with_grad {
            let wrt: Vec<&Tensor> = params.iter().collect();
            outputs.extend(grad(&loss, &wrt).unwrap());
        }
        let refs: Vec<&Tensor> = outputs.iter().collect();
        graph.build(&refs).unwrap().compile(client).unwrap()
    };
    (build(false), build(true))
}
