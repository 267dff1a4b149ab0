//! Tokenisation granularities of a corpus (SCIENCE.md section 4): the same text as a stream of
//! bytes, characters, words, fixed `k`-mers or byte-level BPE tokens (HF `tokenizers`), and the
//! chorales as voice tokens or whole frames.
//!
//! Every [`TokenStream`] records `chars_per_token`, the mean number of characters of the text per
//! token, so that a lag in tokens can be rescaled to a distance in characters
//! (`lag_chars = lag × chars_per_token`) for the self-similarity check.
//!
//! | granularity | tokens | `vocab_size` |
//! |---|---|---|
//! | `byte` | UTF-8 bytes | 256 |
//! | `char` | Unicode scalar values | distinct characters |
//! | `word` | the `tokenizers` `Whitespace` pre-tokenizer pieces (`\w+` or `[^\w\s]+`; whitespace dropped) | distinct pieces |
//! | `kmer-K` | non-overlapping `K`-character chunks (a trailing partial chunk is dropped) | distinct chunks |
//! | `bpe-V` | byte-level BPE (GPT-2 style) with `V` tokens trained on the corpus itself | `V` |
//! | `token` | chorale voice tokens (pitch, hold, rest, end; see [`crate::corpus`]) | 131 |
//! | `frame` | chorale frames: the four voice tokens of one sixteenth step as one symbol | distinct frames |
//!
//! Ids of `char`, `word`, `kmer-K` and `frame` are the ranks of the symbols in sorted order, so
//! they depend only on the text. A BPE tokenizer is trained once and cached as JSON under
//! `data/tokenizers/<corpus>-bpe-<V>.json`, so models and MI profiles see the same tokens.
//! Text longer than [`BPE_CHUNK`] characters without a newline (the genome) is cut into chunks of
//! that length for BPE, so no token crosses a chunk boundary.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::{
    AddedToken, DecoderWrapper, OffsetReferential, OffsetType, PostProcessorWrapper,
    PreTokenizedString, PreTokenizer, PreTokenizerWrapper, TokenizerBuilder, TokenizerImpl,
};

use crate::corpus::{self, CorpusError, END, load_chorales};

/// Longest piece of text fed to BPE at once (characters).
pub const BPE_CHUNK: usize = 256;

/// A granularity (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Granularity {
    /// UTF-8 bytes.
    Byte,
    /// Characters.
    Char,
    /// Words and punctuation runs.
    Word,
    /// Non-overlapping `k`-character chunks.
    Kmer(usize),
    /// Byte-level BPE with this vocabulary size.
    Bpe(usize),
    /// Chorale voice tokens.
    Token,
    /// Chorale frames.
    Frame,
}

impl Granularity {
    /// Parse `byte`, `char`, `word`, `kmer-K` (K in 1..=16), `bpe-V` (V in 300..=65536),
    /// `token`, `frame`.
    ///
    /// # Errors
    /// [`crate::TaskError`] naming `granularity`.
    pub fn parse(s: &str) -> Result<Self, crate::TaskError> {
        let bad = |m: String| crate::TaskError::Invalid {
            field: "granularity",
            message: m,
        };
        let num = |rest: &str, lo: usize, hi: usize| -> Result<usize, crate::TaskError> {
            match rest.parse::<usize>() {
                Ok(v) if (lo..=hi).contains(&v) => Ok(v),
                _ => Err(bad(format!("`{s}`: the number must be in {lo}..={hi}"))),
            }
        };
        Ok(match s {
            "byte" => Granularity::Byte,
            "char" => Granularity::Char,
            "word" => Granularity::Word,
            "token" => Granularity::Token,
            "frame" => Granularity::Frame,
            _ if s.starts_with("kmer-") => Granularity::Kmer(num(&s[5..], 1, 16)?),
            _ if s.starts_with("bpe-") => Granularity::Bpe(num(&s[4..], 300, 65536)?),
            _ => {
                return Err(bad(format!(
                    "`{s}` is not one of byte, char, word, kmer-K, bpe-V, token, frame"
                )));
            }
        })
    }

    /// The name, as parsed by [`Granularity::parse`].
    pub fn name(&self) -> String {
        match self {
            Granularity::Byte => "byte".into(),
            Granularity::Char => "char".into(),
            Granularity::Word => "word".into(),
            Granularity::Kmer(k) => format!("kmer-{k}"),
            Granularity::Bpe(v) => format!("bpe-{v}"),
            Granularity::Token => "token".into(),
            Granularity::Frame => "frame".into(),
        }
    }
}

/// A corpus as a token stream at one granularity.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenStream {
    /// Token ids, `0..vocab_size`.
    pub ids: Vec<u32>,
    /// Size of the id space.
    pub vocab_size: usize,
    /// Characters of the underlying text (chorales: voice tokens).
    pub n_chars: usize,
    /// `n_chars / ids.len()`.
    pub chars_per_token: f64,
}

impl TokenStream {
    fn new(ids: Vec<u32>, vocab_size: usize, n_chars: usize) -> Self {
        let chars_per_token = n_chars as f64 / ids.len().max(1) as f64;
        TokenStream {
            ids,
            vocab_size,
            n_chars,
            chars_per_token,
        }
    }
}

/// Ids by rank of each symbol in sorted order.
fn rank_ids<T: Ord + Clone>(symbols: &[T]) -> (Vec<u32>, usize) {
    let set: BTreeSet<T> = symbols.iter().cloned().collect();
    let map: BTreeMap<T, u32> = set
        .into_iter()
        .enumerate()
        .map(|(i, s)| (s, i as u32))
        .collect();
    (symbols.iter().map(|s| map[s]).collect(), map.len())
}

/// Tokenise `text` at a text granularity (`byte`, `char`, `word`, `kmer-K`; `bpe-V` needs
/// [`bpe_stream`]).
///
/// # Errors
/// [`crate::TaskError::Invalid`] on `granularity` for `bpe-V`, `token`, `frame`.
pub fn text_stream(text: &str, g: Granularity) -> Result<TokenStream, crate::TaskError> {
    let n_chars = text.chars().count();
    Ok(match g {
        Granularity::Byte => TokenStream::new(text.bytes().map(u32::from).collect(), 256, n_chars),
        Granularity::Char => {
            let chars: Vec<char> = text.chars().collect();
            let (ids, v) = rank_ids(&chars);
            TokenStream::new(ids, v, n_chars)
        }
        Granularity::Word => {
            let words = words(text);
            let (ids, v) = rank_ids(&words);
            TokenStream::new(ids, v, n_chars)
        }
        Granularity::Kmer(k) => {
            let chars: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
            let chunks: Vec<&[char]> = chars.chunks_exact(k).collect();
            let (ids, v) = rank_ids(&chunks);
            TokenStream::new(ids, v, n_chars)
        }
        _ => {
            return Err(crate::TaskError::Invalid {
                field: "granularity",
                message: format!("`{}` is not a plain text granularity", g.name()),
            });
        }
    })
}

/// The `Whitespace` pre-tokenizer's pieces of `text`.
pub fn words(text: &str) -> Vec<String> {
    let mut pre = PreTokenizedString::from(text);
    Whitespace {}
        .pre_tokenize(&mut pre)
        .expect("the Whitespace pre-tokenizer does not fail");
    pre.get_splits(OffsetReferential::Original, OffsetType::Char)
        .into_iter()
        .map(|(s, _, _)| s.to_string())
        .collect()
}

/// Pieces fed to BPE: lines (with their newline), longer ones cut into [`BPE_CHUNK`] characters.
fn bpe_pieces(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.split_inclusive('\n') {
        if line.chars().count() <= BPE_CHUNK {
            out.push(line.to_string());
        } else {
            let cs: Vec<char> = line.chars().collect();
            out.extend(cs.chunks(BPE_CHUNK).map(|c| c.iter().collect::<String>()));
        }
    }
    out
}

type Bpe = TokenizerImpl<
    BPE,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

fn bpe_err(name: &str, e: impl std::fmt::Display) -> CorpusError {
    CorpusError::Format {
        name: name.into(),
        message: format!("BPE: {e}"),
    }
}

/// Train (or load the cached) byte-level BPE tokenizer of `vocab_size` tokens on `text` and
/// tokenise it. The tokenizer is cached at `cache` (JSON, written atomically); delete it to
/// retrain.
///
/// # Errors
/// [`CorpusError::Format`] if training, loading or encoding fails; I/O errors.
pub fn bpe_stream(
    text: &str,
    vocab_size: usize,
    cache: &Path,
    name: &str,
) -> Result<TokenStream, CorpusError> {
    let pieces = bpe_pieces(text);
    let tk: Bpe = if cache.exists() {
        let json = std::fs::read_to_string(cache).map_err(|e| bpe_err(name, e))?;
        serde_json::from_str(&json).map_err(|e| bpe_err(name, e))?
    } else {
        let mut tk: Bpe = TokenizerBuilder::new()
            .with_model(BPE::default())
            .with_normalizer(None)
            .with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
                false, true, true,
            ))))
            .with_post_processor(None)
            .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())))
            .build()
            .map_err(|e| bpe_err(name, e))?;
        let mut trainer = BpeTrainerBuilder::new()
            .show_progress(false)
            .vocab_size(vocab_size)
            .min_frequency(2)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .special_tokens(Vec::<AddedToken>::new())
            .build();
        tk.train(&mut trainer, pieces.iter().cloned())
            .map_err(|e| bpe_err(name, e))?;
        if let Some(dir) = cache.parent() {
            std::fs::create_dir_all(dir).map_err(|e| bpe_err(name, e))?;
        }
        let json = tk.to_string(false).map_err(|e| bpe_err(name, e))?;
        let tmp = cache.with_extension("tmp");
        std::fs::write(&tmp, json).map_err(|e| bpe_err(name, e))?;
        std::fs::rename(&tmp, cache).map_err(|e| bpe_err(name, e))?;
        tk
    };
    let enc = tk
        .encode_batch(pieces, false)
        .map_err(|e| bpe_err(name, e))?;
    let ids: Vec<u32> = enc
        .iter()
        .flat_map(|e| e.get_ids().iter().copied())
        .collect();
    let v = tk.get_vocab_size(true);
    Ok(TokenStream::new(ids, v, text.chars().count()))
}

/// Corpus `name` from `data_dir` at granularity `g` (see [`crate::corpus`] for the corpora).
///
/// # Errors
/// [`CorpusError`]: unknown or missing corpus (with the `make data` hint), a granularity the
/// corpus does not offer, BPE failures.
pub fn corpus_stream(
    data_dir: &Path,
    name: &str,
    g: Granularity,
) -> Result<TokenStream, CorpusError> {
    let spec = corpus::spec(name)?;
    if name == "chorales" {
        let chorales = load_chorales(data_dir)?;
        let mut frames: Vec<[u32; 4]> = Vec::new();
        for c in &chorales {
            frames.extend_from_slice(c);
            frames.push([END; 4]);
        }
        return match g {
            Granularity::Token => {
                let ids: Vec<u32> = frames.iter().flatten().copied().collect();
                let n = ids.len();
                Ok(TokenStream::new(ids, END as usize + 1, n))
            }
            Granularity::Frame => {
                let (ids, v) = rank_ids(&frames);
                Ok(TokenStream::new(ids, v, 4 * frames.len()))
            }
            _ => Err(unsupported(spec, g)),
        };
    }
    // every text granularity works on the text corpora; `token` and `frame` are the chorales'
    let text = corpus::load_text(data_dir, name)?;
    let text = text.trim_end_matches('\n');
    match g {
        Granularity::Bpe(v) => {
            let cache = data_dir
                .join("tokenizers")
                .join(format!("{name}-bpe-{v}.json"));
            bpe_stream(text, v, &cache, name)
        }
        Granularity::Token | Granularity::Frame => Err(unsupported(spec, g)),
        _ => text_stream(text, g).map_err(|e| CorpusError::Format {
            name: name.into(),
            message: e.to_string(),
        }),
    }
}

fn unsupported(spec: &corpus::CorpusSpec, g: Granularity) -> CorpusError {
    CorpusError::Format {
        name: spec.name.into(),
        message: format!(
            "granularity {} is not offered; use one of {}",
            g.name(),
            spec.granularities.join(", ")
        ),
    }
}

/// Process-wide cache of [`corpus_stream`] results, keyed by (data folder, corpus, granularity):
/// a training run asks for its corpus at every batch.
///
/// # Errors
/// As [`corpus_stream`].
pub fn cached_stream(
    data_dir: &Path,
    name: &str,
    g: Granularity,
) -> Result<std::sync::Arc<TokenStream>, CorpusError> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    type Key = (std::path::PathBuf, String, Granularity);
    static CACHE: OnceLock<Mutex<HashMap<Key, Arc<TokenStream>>>> = OnceLock::new();
    let key = (data_dir.to_path_buf(), name.to_string(), g);
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(s) = cache.lock().expect("cache lock").get(&key) {
        return Ok(s.clone());
    }
    let s = Arc::new(corpus_stream(data_dir, name, g)?);
    cache.lock().expect("cache lock").insert(key, s.clone());
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names_round_trip() {
        for s in [
            "byte", "char", "word", "kmer-3", "bpe-512", "token", "frame",
        ] {
            assert_eq!(Granularity::parse(s).unwrap().name(), s);
        }
        assert_eq!(
            Granularity::parse("bpe-10").unwrap_err().to_string(),
            "granularity is invalid: `bpe-10`: the number must be in 300..=65536"
        );
        assert!(Granularity::parse("sentence").is_err());
    }

    #[test]
    fn text_granularities_hand_computed() {
        let t = "to be, or not to be";
        let c = text_stream(t, Granularity::Char).unwrap();
        assert_eq!(c.ids.len(), 19);
        // sorted distinct chars: ' ' ',' 'b' 'e' 'n' 'o' 'r' 't'
        assert_eq!(c.vocab_size, 8);
        assert_eq!(&c.ids[..4], &[7, 5, 0, 2]);
        let w = text_stream(t, Granularity::Word).unwrap();
        assert_eq!(words(t), ["to", "be", ",", "or", "not", "to", "be"]);
        assert_eq!(w.vocab_size, 5);
        assert!((w.chars_per_token - 19.0 / 7.0).abs() < 1e-12);
        let k = text_stream("ACGTACGA", Granularity::Kmer(3)).unwrap();
        assert_eq!(k.ids, [0, 1]); // ACG, TAC (GA dropped)
        assert!((k.chars_per_token - 8.0 / 2.0).abs() < 1e-12);
        let b = text_stream("é", Granularity::Byte).unwrap();
        assert_eq!(b.ids, [0xc3, 0xa9]);
        assert!((b.chars_per_token - 0.5).abs() < 1e-12);
    }

    #[test]
    fn bpe_trains_caches_and_round_trips() {
        let text = "the cat sat on the mat\nthe cat ate the rat\n".repeat(50);
        let dir = std::env::temp_dir().join(format!("tasks-bpe-test-{}", std::process::id()));
        let cache = dir.join("t-bpe-300.json");
        let _ = std::fs::remove_file(&cache);
        let a = bpe_stream(&text, 300, &cache, "t").unwrap();
        assert!(cache.exists());
        let b = bpe_stream(&text, 300, &cache, "t").unwrap();
        assert_eq!(a, b);
        assert!(a.vocab_size <= 300 && a.vocab_size > 256);
        // merges shorten the stream: fewer tokens than bytes
        assert!(a.ids.len() < text.len() / 2, "{} tokens", a.ids.len());
        let tk: Bpe = serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
        let dec = tk.decode(&a.ids, false).unwrap();
        assert_eq!(dec, text);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
