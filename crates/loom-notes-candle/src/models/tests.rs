use super::*;

fn special() -> HashSet<u32> {
    [0, 1, 2, 3].into_iter().collect()
}

#[test]
fn token_counts_count_each_id_and_skip_special_ids() {
    let sparse = token_count_sparse(&[0, 9, 5, 9, 3, 9, 2, 1], &special());
    assert_eq!(sparse.indices, [5, 9]);
    assert_eq!(sparse.values, [1.0, 3.0]);
    assert_eq!(
        token_count_sparse(&[0, 2], &special()),
        SparseVector::default()
    );
}

#[test]
fn head_weights_keep_the_maximum_per_id_and_drop_special_ids_and_non_positive_weights() {
    let ids = [0, 7, 5, 7, 3, 8, 6, 2];
    let weights = [9.0, 0.25, 0.5, 0.75, 9.0, 0.0, f32::NAN, 9.0];
    let sparse = max_weight_sparse(&ids, &weights, &special());
    assert_eq!(sparse.indices, [5, 7]);
    assert_eq!(sparse.values, [0.5, 0.75]);
    // The maximum, not the last or the first.
    let sparse = max_weight_sparse(&[7, 7, 7], &[0.25, 0.75, 0.5], &special());
    assert_eq!(sparse.values, [0.75]);
    // Weights of padding positions beyond the ids are ignored.
    let sparse = max_weight_sparse(&[7], &[0.25, 5.0, 5.0], &special());
    assert_eq!((sparse.indices, sparse.values), (vec![7], vec![0.25]));
    let sparse = max_weight_sparse(&[7, 8], &[-1.0, -0.5], &special());
    assert_eq!(sparse, SparseVector::default());
}

#[test]
fn batches_group_long_sequences_first_and_cover_every_index_once() {
    let batches = length_sorted_batches(&[3, 9, 1, 7, 5], 2);
    assert_eq!(batches, [vec![1, 3], vec![4, 0], vec![2]]);
    assert!(length_sorted_batches(&[], 16).is_empty());
}

#[test]
fn run_batches_restores_the_input_order() {
    let sequences = vec![vec![1], vec![1, 2, 3], vec![1, 2], vec![1, 2, 3, 4]];
    let mut batch_sizes = Vec::new();
    let lengths = run_batches(&sequences, 3, "m", |rows| {
        batch_sizes.push(rows.len());
        Ok(rows.iter().map(|row| row.len()).collect())
    })
    .unwrap();
    assert_eq!(lengths, [1, 3, 2, 4]);
    assert_eq!(batch_sizes, [3, 1]);
}

#[test]
fn run_batches_refuses_a_short_batch_result() {
    let sequences = vec![vec![1], vec![2]];
    let error = run_batches(&sequences, 2, "m", |_| Ok(vec![0])).unwrap_err();
    assert!(
        matches!(&error, Error::Inference { model, .. } if model == "m"),
        "{error:?}"
    );
}

#[test]
fn batches_pad_on_the_right_with_the_pad_id_and_mask_the_padding() {
    let batch = Batch::new(&[&[5, 6, 7], &[8]], 1).unwrap();
    assert_eq!(
        batch.ids.to_vec2::<u32>().unwrap(),
        [vec![5, 6, 7], vec![8, 1, 1]]
    );
    assert_eq!(
        batch.mask.to_vec2::<u32>().unwrap(),
        [vec![1, 1, 1], vec![1, 0, 0]]
    );
    assert_eq!(
        batch.type_ids.to_vec2::<u32>().unwrap(),
        [vec![0, 0, 0], vec![0, 0, 0]]
    );
}

#[test]
fn mean_pooling_averages_unmasked_tokens_and_cls_takes_the_first() {
    // Two sequences of three tokens, two dims; the second has one padding token.
    let hidden = Tensor::new(
        &[
            [[1f32, 2.0], [3.0, 4.0], [5.0, 6.0]],
            [[1.0, 1.0], [3.0, 5.0], [100.0, 100.0]],
        ],
        &Device::Cpu,
    )
    .unwrap();
    let mask = Tensor::new(&[[1u32, 1, 1], [1, 1, 0]], &Device::Cpu).unwrap();
    let mean = pool(&hidden, &mask, Pooling::Mean).unwrap();
    assert_eq!(mean.to_vec2::<f32>().unwrap(), [[3.0, 4.0], [2.0, 3.0]]);
    let cls = pool(&hidden, &mask, Pooling::Cls).unwrap();
    assert_eq!(cls.to_vec2::<f32>().unwrap(), [[1.0, 2.0], [1.0, 1.0]]);
}

#[test]
fn l2_normalisation_gives_unit_rows_and_keeps_zero_rows_zero() {
    let vectors = Tensor::new(&[[3f32, 4.0], [0.0, 0.0]], &Device::Cpu).unwrap();
    let normalized = l2_normalize(&vectors).unwrap().to_vec2::<f32>().unwrap();
    assert_eq!(normalized, [[0.6, 0.8], [0.0, 0.0]]);
}

#[test]
fn the_sigmoid_maps_logits_into_the_unit_interval() {
    assert_eq!(xlm_roberta::sigmoid(0.0), 0.5);
    assert!((xlm_roberta::sigmoid(2.0) - 0.880_797).abs() < 1e-6);
    assert!((xlm_roberta::sigmoid(-2.0) - 0.119_203).abs() < 1e-6);
}
