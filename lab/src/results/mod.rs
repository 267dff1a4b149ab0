//! Parquet tables (arrow-rs): building record batches column by column, crash-safe writing,
//! reading and merging. The schemas are documented in `results/README.md`.
//!
//! Every file is written to a temporary name in the same folder (`.<name>.tmp-<pid>`), flushed,
//! fsynced and renamed into place, so a reader sees a table whole or not at all.

pub mod tables;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

/// Version of the lab's table schemas and run-identity hash. Bump when a column changes meaning.
pub const SCHEMA_VERSION: i32 = 1;

/// Errors of the results layer.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// Filesystem error, with the path.
    #[error("cannot write or read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Parquet or Arrow error, with the path.
    #[error("bad Parquet file {path}: {message}")]
    Parquet {
        /// The file.
        path: PathBuf,
        /// The cause.
        message: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ResultsError + '_ {
    move |source| ResultsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn pq_err(path: &Path) -> impl FnOnce(String) -> ResultsError + '_ {
    move |message| ResultsError::Parquet {
        path: path.to_path_buf(),
        message,
    }
}

/// Builds one record batch column by column. Every table starts with `schema_version` (int32).
#[derive(Default)]
pub struct TableBuilder {
    fields: Vec<Field>,
    columns: Vec<ArrayRef>,
    rows: Option<usize>,
}

impl TableBuilder {
    /// A table of `rows` rows; its first column is `schema_version`.
    pub fn new(rows: usize) -> Self {
        let mut t = Self {
            rows: Some(rows),
            ..Default::default()
        };
        t.push(
            Field::new("schema_version", DataType::Int32, false),
            Arc::new(Int32Array::from(vec![SCHEMA_VERSION; rows])),
        );
        t
    }

    fn push(&mut self, field: Field, col: ArrayRef) {
        assert_eq!(
            Some(col.len()),
            self.rows,
            "column {} has the wrong length",
            field.name()
        );
        self.fields.push(field);
        self.columns.push(col);
    }

    /// A non-null string column.
    pub fn str(mut self, name: &str, v: Vec<String>) -> Self {
        self.push(
            Field::new(name, DataType::Utf8, false),
            Arc::new(StringArray::from(v)),
        );
        self
    }
    /// A nullable string column.
    pub fn opt_str(mut self, name: &str, v: Vec<Option<String>>) -> Self {
        self.push(
            Field::new(name, DataType::Utf8, true),
            Arc::new(StringArray::from(v)),
        );
        self
    }
    /// A non-null int64 column.
    pub fn i64(mut self, name: &str, v: Vec<i64>) -> Self {
        self.push(
            Field::new(name, DataType::Int64, false),
            Arc::new(Int64Array::from(v)),
        );
        self
    }
    /// A nullable int64 column.
    pub fn opt_i64(mut self, name: &str, v: Vec<Option<i64>>) -> Self {
        self.push(
            Field::new(name, DataType::Int64, true),
            Arc::new(Int64Array::from(v)),
        );
        self
    }
    /// A non-null float64 column.
    pub fn f64(mut self, name: &str, v: Vec<f64>) -> Self {
        self.push(
            Field::new(name, DataType::Float64, false),
            Arc::new(Float64Array::from(v)),
        );
        self
    }
    /// A nullable float64 column.
    pub fn opt_f64(mut self, name: &str, v: Vec<Option<f64>>) -> Self {
        self.push(
            Field::new(name, DataType::Float64, true),
            Arc::new(Float64Array::from(v)),
        );
        self
    }
    /// A non-null boolean column.
    pub fn bool(mut self, name: &str, v: Vec<bool>) -> Self {
        self.push(
            Field::new(name, DataType::Boolean, false),
            Arc::new(BooleanArray::from(v)),
        );
        self
    }

    /// Finish the batch.
    pub fn build(self) -> RecordBatch {
        RecordBatch::try_new(Arc::new(Schema::new(self.fields)), self.columns)
            .expect("columns checked on push")
    }
}

/// Write `batches` (all of schema `schema`) to `path` atomically (temporary file + rename).
/// Snappy compression. An empty `batches` writes a valid table with zero rows.
pub fn write_parquet_atomic(
    path: &Path,
    schema: SchemaRef,
    batches: &[RecordBatch],
) -> Result<(), ResultsError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("table");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let file = File::create(&tmp).map_err(io_err(&tmp))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build();
        let mut writer =
            ArrowWriter::try_new(file.try_clone().map_err(io_err(&tmp))?, schema, Some(props))
                .map_err(|e| pq_err(&tmp)(e.to_string()))?;
        for b in batches {
            writer.write(b).map_err(|e| pq_err(&tmp)(e.to_string()))?;
        }
        writer.close().map_err(|e| pq_err(&tmp)(e.to_string()))?;
        file.sync_all().map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io_err(path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Write one batch atomically.
pub fn write_batch(path: &Path, batch: &RecordBatch) -> Result<(), ResultsError> {
    write_parquet_atomic(path, batch.schema(), std::slice::from_ref(batch))
}

/// Read every batch of a Parquet file.
pub fn read_parquet(path: &Path) -> Result<(SchemaRef, Vec<RecordBatch>), ResultsError> {
    let file = File::open(path).map_err(io_err(path))?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| pq_err(path)(e.to_string()))?;
    let schema = builder.schema().clone();
    let reader = builder.build().map_err(|e| pq_err(path)(e.to_string()))?;
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pq_err(path)(e.to_string()))?;
    Ok((schema, batches))
}

/// Concatenate the tables in `inputs` (same schema) into `out`, atomically. Returns the number
/// of rows written, or `None` when there was no input file.
pub fn merge_tables(inputs: &[PathBuf], out: &Path) -> Result<Option<usize>, ResultsError> {
    let mut schema: Option<SchemaRef> = None;
    let mut all = Vec::new();
    for p in inputs {
        let (s, batches) = read_parquet(p)?;
        match &schema {
            None => schema = Some(s),
            Some(first) if first.fields() != s.fields() => {
                return Err(pq_err(p)(format!(
                    "its columns differ from {}'s; was it written by another lab version?",
                    inputs[0].display()
                )));
            }
            _ => {}
        }
        all.extend(batches);
    }
    let Some(schema) = schema else {
        return Ok(None);
    };
    let rows = all.iter().map(|b| b.num_rows()).sum();
    write_parquet_atomic(out, schema, &all)?;
    Ok(Some(rows))
}

/// Remove temporary files (`.*.tmp-*`) left in `dir` by a killed writer. Returns how many.
pub fn clean_temporaries(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.contains(".tmp-") && std::fs::remove_file(e.path()).is_ok()
        {
            n += 1;
        }
    }
    n
}

/// Column accessors used when reading tables back.
pub mod column {
    use super::*;
    use arrow_array::Array;

    fn col<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> Option<&'a T> {
        batch.column_by_name(name)?.as_any().downcast_ref::<T>()
    }

    /// String column values (nulls as `None`).
    pub fn strings(batch: &RecordBatch, name: &str) -> Vec<Option<String>> {
        col::<StringArray>(batch, name)
            .map(|a| {
                (0..a.len())
                    .map(|i| a.is_valid(i).then(|| a.value(i).to_string()))
                    .collect()
            })
            .unwrap_or_else(|| vec![None; batch.num_rows()])
    }

    /// Float64 column values.
    pub fn floats(batch: &RecordBatch, name: &str) -> Vec<Option<f64>> {
        col::<Float64Array>(batch, name)
            .map(|a| {
                (0..a.len())
                    .map(|i| a.is_valid(i).then(|| a.value(i)))
                    .collect()
            })
            .unwrap_or_else(|| vec![None; batch.num_rows()])
    }

    /// Int64 column values.
    pub fn ints(batch: &RecordBatch, name: &str) -> Vec<Option<i64>> {
        col::<Int64Array>(batch, name)
            .map(|a| {
                (0..a.len())
                    .map(|i| a.is_valid(i).then(|| a.value(i)))
                    .collect()
            })
            .unwrap_or_else(|| vec![None; batch.num_rows()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lab-results-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn roundtrip_and_merge() {
        let dir = tmpdir("roundtrip");
        let a = TableBuilder::new(2)
            .str("run_id", vec!["a".into(), "b".into()])
            .opt_f64("x", vec![Some(1.5), None])
            .i64("n", vec![3, 4])
            .build();
        let b = TableBuilder::new(1)
            .str("run_id", vec!["c".into()])
            .opt_f64("x", vec![Some(2.5)])
            .i64("n", vec![5])
            .build();
        write_batch(&dir.join("a.parquet"), &a).unwrap();
        write_batch(&dir.join("b.parquet"), &b).unwrap();
        let rows = merge_tables(
            &[dir.join("a.parquet"), dir.join("b.parquet")],
            &dir.join("all.parquet"),
        )
        .unwrap();
        assert_eq!(rows, Some(3));
        let (schema, batches) = read_parquet(&dir.join("all.parquet")).unwrap();
        assert_eq!(schema.field(0).name(), "schema_version");
        let ids: Vec<_> = batches
            .iter()
            .flat_map(|b| column::strings(b, "run_id"))
            .collect();
        assert_eq!(
            ids,
            vec![Some("a".into()), Some("b".into()), Some("c".into())]
        );
        let xs: Vec<_> = batches
            .iter()
            .flat_map(|b| column::floats(b, "x"))
            .collect();
        assert_eq!(xs, vec![Some(1.5), None, Some(2.5)]);
        // No temporary file is left behind.
        assert_eq!(clean_temporaries(&dir), 0);
    }

    #[test]
    fn merge_rejects_different_columns() {
        let dir = tmpdir("mismatch");
        let a = TableBuilder::new(1).i64("n", vec![1]).build();
        let b = TableBuilder::new(1).f64("n", vec![1.0]).build();
        write_batch(&dir.join("a.parquet"), &a).unwrap();
        write_batch(&dir.join("b.parquet"), &b).unwrap();
        let err = merge_tables(
            &[dir.join("a.parquet"), dir.join("b.parquet")],
            &dir.join("o.parquet"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("columns differ"), "{err}");
        assert!(!dir.join("o.parquet").exists());
    }

    #[test]
    fn temporaries_are_cleaned() {
        let dir = tmpdir("clean");
        std::fs::write(dir.join(".runs.parquet.tmp-123"), b"partial").unwrap();
        std::fs::write(dir.join("keep.parquet"), b"x").unwrap();
        assert_eq!(clean_temporaries(&dir), 1);
        assert!(dir.join("keep.parquet").exists());
    }
}
