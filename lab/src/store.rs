//! Parquet storage (arrow-rs): the generic layer under every table the lab writes — building
//! record batches ([`TableBuilder`]), crash-safe writes (temporary name, then rename), reads,
//! merges and typed column access ([`column`]), and the schema version stamped on every row.
//! It depends on nothing else in the lab; [`crate::results`] defines the run tables on top of
//! it, and [`crate::mi`] its MI tables.

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
///
/// 3 (2026-12-02): a run's encoding parameters form its own section too (config JSON
/// `"encoding": {"kind": "tapa", "tapa_rho": …}`), so run ids changed again, and a run's tables
/// hold only its own encoding's parameters (`tapa_alpha` is null for a RoPE run, `rope_p` for
/// anything but p-RoPE).
/// 2 (2026-12-02): a run's task parameters form its own section (config JSON
/// `"task": {"kind": "block", "variant": …}`), so run ids changed, and a run's tables hold only
/// its own task's parameters (`variant`, `block_len`, `noise` are null for a non-block run).
/// 1: every task's parameters in every run.
pub const SCHEMA_VERSION: i32 = 3;

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

/// Set the boolean column `selected` of the run table at `path` (atomically, replacing any
/// earlier one): `true` for the runs whose `run_id` is in `selected`, `false` for the others;
/// `true` for every run when there is no selection (`None`). docs/analysis-rules.md R58.
pub fn mark_selected(
    path: &Path,
    selected: Option<&std::collections::HashSet<String>>,
) -> Result<(), ResultsError> {
    let (schema, batches) = read_parquet(path)?;
    let mut fields: Vec<Field> = schema
        .fields()
        .iter()
        .filter(|f| f.name() != "selected")
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("selected", DataType::Boolean, false));
    let out_schema: SchemaRef = Arc::new(Schema::new(fields));
    let mut out = Vec::with_capacity(batches.len());
    for b in &batches {
        let ids = column::strings(b, "run_id");
        let flags: BooleanArray = ids
            .iter()
            .map(|id| Some(selected.is_none_or(|s| id.as_ref().is_some_and(|id| s.contains(id)))))
            .collect();
        let mut columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| f.name() != "selected")
            .map(|(i, _)| b.column(i).clone())
            .collect();
        columns.push(Arc::new(flags));
        out.push(
            RecordBatch::try_new(out_schema.clone(), columns)
                .map_err(|e| pq_err(path)(e.to_string()))?,
        );
    }
    write_parquet_atomic(path, out_schema, &out)
}

/// Concatenate the tables in `inputs` (same schema) into `out`, atomically. Returns the number
/// of rows written, or `None` when there was no input file.
pub fn merge_tables(inputs: &[PathBuf], out: &Path) -> Result<Option<usize>, ResultsError> {
    // Union of the columns, in order of first appearance: tables written by an older lab version
    // (fewer columns) merge with newer ones, the missing values as nulls. A column whose type
    // differs between files is an error.
    let mut fields: Vec<Field> = Vec::new();
    let mut parts = Vec::new();
    for p in inputs {
        let (s, batches) = read_parquet(p)?;
        for f in s.fields() {
            match fields.iter_mut().find(|g| g.name() == f.name()) {
                Some(g) if g.data_type() != f.data_type() => {
                    return Err(pq_err(p)(format!(
                        "its column `{}` is {} but {} in other tables; was it written by another lab version?",
                        f.name(),
                        f.data_type(),
                        g.data_type()
                    )));
                }
                Some(g) => {
                    if f.is_nullable() && !g.is_nullable() {
                        *g = g.clone().with_nullable(true);
                    }
                }
                None => fields.push(f.as_ref().clone()),
            }
        }
        parts.push((s, batches));
    }
    if parts.is_empty() {
        return Ok(None);
    }
    for f in fields.iter_mut() {
        if parts
            .iter()
            .any(|(s, _)| s.field_with_name(f.name()).is_err())
        {
            *f = f.clone().with_nullable(true);
        }
    }
    let schema: SchemaRef = Arc::new(Schema::new(fields.clone()));
    let mut all = Vec::new();
    for (_, batches) in parts {
        for b in batches {
            let columns = fields
                .iter()
                .map(|f| {
                    b.column_by_name(f.name())
                        .cloned()
                        .unwrap_or_else(|| arrow_array::new_null_array(f.data_type(), b.num_rows()))
                })
                .collect();
            all.push(RecordBatch::try_new(schema.clone(), columns).map_err(|e| {
                ResultsError::Parquet {
                    path: out.to_path_buf(),
                    message: e.to_string(),
                }
            })?);
        }
    }
    let rows = all.iter().map(|b| b.num_rows()).sum();
    write_parquet_atomic(out, schema, &all)?;
    Ok(Some(rows))
}

/// Remove temporaries (`.*.tmp-*` files, and folders of a killed `lab merge` copy) left in
/// `dir` by a killed writer. Returns how many.
pub fn clean_temporaries(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with('.') && name.contains(".tmp-")) {
            continue;
        }
        let removed = if e.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(e.path())
        } else {
            std::fs::remove_file(e.path())
        };
        if removed.is_ok() {
            n += 1;
        }
    }
    n
}

/// Write `bytes` to `path` atomically: a temporary file in the same folder
/// (`.<name>.tmp-<pid>`), fsynced, then renamed into place.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
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

    /// Boolean column values.
    pub fn bools(batch: &RecordBatch, name: &str) -> Vec<Option<bool>> {
        col::<BooleanArray>(batch, name)
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

    /// Tables re-saved by Polars (zstd, its default) or pyarrow with lz4 read back: the
    /// codecs are compiled in (issue 16).
    #[test]
    fn zstd_and_lz4_tables_read_back() {
        use parquet::basic::ZstdLevel;
        let dir = tmpdir("codecs");
        let batch = TableBuilder::new(2)
            .str("run_id", vec!["a".into(), "b".into()])
            .f64("x", vec![0.25, 4.0])
            .build();
        for (name, codec) in [
            ("zstd", Compression::ZSTD(ZstdLevel::default())),
            ("lz4", Compression::LZ4_RAW),
        ] {
            let path = dir.join(format!("{name}.parquet"));
            let props = WriterProperties::builder().set_compression(codec).build();
            let mut w =
                ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), Some(props))
                    .unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            let (_, batches) = read_parquet(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                column::floats(&batches[0], "x"),
                vec![Some(0.25), Some(4.0)]
            );
        }
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
        assert!(
            err.to_string().contains("column `n` is Float64 but Int64"),
            "{err}"
        );
        assert!(!dir.join("o.parquet").exists());
    }

    /// Tables with fewer columns (an older lab version) merge with the missing values as nulls.
    #[test]
    fn merge_fills_missing_columns_with_nulls() {
        let dir = tmpdir("union");
        let old = TableBuilder::new(1).i64("n", vec![1]).build();
        let new = TableBuilder::new(2)
            .i64("n", vec![2, 3])
            .f64("extra", vec![0.5, 1.5])
            .build();
        write_batch(&dir.join("a.parquet"), &old).unwrap();
        write_batch(&dir.join("b.parquet"), &new).unwrap();
        let rows = merge_tables(
            &[dir.join("a.parquet"), dir.join("b.parquet")],
            &dir.join("o.parquet"),
        )
        .unwrap();
        assert_eq!(rows, Some(3));
        let (schema, batches) = read_parquet(&dir.join("o.parquet")).unwrap();
        assert_eq!(schema.fields().len(), 3); // schema_version, n, extra
        let extra: Vec<Option<f64>> = batches
            .iter()
            .flat_map(|b| column::floats(b, "extra"))
            .collect();
        assert_eq!(extra, vec![None, Some(0.5), Some(1.5)]);
        let n: Vec<Option<i64>> = batches.iter().flat_map(|b| column::ints(b, "n")).collect();
        assert_eq!(n, vec![Some(1), Some(2), Some(3)]);
    }

    #[test]
    fn temporaries_are_cleaned() {
        let dir = tmpdir("clean");
        std::fs::write(dir.join(".runs.parquet.tmp-123"), b"partial").unwrap();
        std::fs::write(dir.join("keep.parquet"), b"x").unwrap();
        std::fs::create_dir_all(dir.join(".abc.tmp-9/evals")).unwrap();
        std::fs::write(dir.join(".abc.tmp-9/evals/x"), b"partial").unwrap();
        assert_eq!(clean_temporaries(&dir), 2);
        assert!(dir.join("keep.parquet").exists());
        assert!(!dir.join(".abc.tmp-9").exists());
        write_file_atomic(&dir.join("c.json"), b"{}").unwrap();
        assert_eq!(std::fs::read(dir.join("c.json")).unwrap(), b"{}");
        assert_eq!(clean_temporaries(&dir), 0);
    }
}
