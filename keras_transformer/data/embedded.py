"""The embedded default training corpus: a generated English→German toy task.

``python train.py`` with no arguments trains on this corpus, so that the
project works offline, in minutes, on a CPU.  Every sentence is produced by
the small rule-based grammar below; **no third-party text is used and nothing
is downloaded** -- the vocabulary lists, the German inflection tables and the
word-order rules were written for this project.

The task is small (a closed vocabulary of 64 nouns plus 36 compounds built
from them, 32 verbs, 16 adjectives, a few time adverbials and places;
sentences of 3-14 English words, 8.7 on average) but the translation has real
structure:
a model cannot get a good BLEU by translating word for word.  Covered:

* **Verb second (V2)** in German main clauses: a fronted time adverbial moves
  the finite verb before the subject ("Today the man sees the dog." →
  "Heute sieht der Mann den Hund."), and so does a fronted subordinate clause
  ("If the man sees the dog, the woman buys a book." → "Wenn der Mann den
  Hund sieht, kauft die Frau ein Buch.").  Yes/no questions put the finite
  verb first, where English uses *do*-support ("Does the man see the dog?" →
  "Sieht der Mann den Hund?").
* **Verb final** in subordinate clauses after *weil, obwohl, während, wenn,
  dass*, with the German comma ("... because the woman buys a book." →
  "..., weil die Frau ein Buch kauft.").
* **Sentence brackets**: the perfect (English simple past *and* present
  perfect both become the German Perfekt, "the child ate the apple" / "the
  child has eaten the apple" → "das Kind hat den Apfel gegessen") and the
  future with *werden* put the participle/infinitive at the end of the main
  clause; separable verbs split off their prefix ("the man picks up the
  ball" → "der Mann hebt den Ball auf"), which re-attaches in verb-final
  clauses ("weil der Mann den Ball aufhebt").
* **Agreement**: article and adjective endings by gender (der/die/das),
  case (nominative subject vs. accusative object: der → den, ein → einen),
  number (sg/pl nouns with their German plurals, verb conjugation: sieht /
  sehen, ich sehe / du siehst) and determiner type (weak endings after
  der/dieser, mixed after ein/mein/kein, strong without an article:
  "der rote Ball", "einen roten Ball", "ein neues Buch", "rote Bälle").
* **Negation**: *nicht* after a definite object, but *kein* for an indefinite
  or bare plural one ("does not see a dog" → "sieht keinen Hund").
* **Compounds**: English two-word noun phrases become one German word whose
  gender and plural come from its head ("the apple tree" → "der Apfelbaum",
  "the kitchen door" → "die Küchentür", "wine glasses" → "Weingläser").
* **Lexical choice**: *eat* is *essen* for people but *fressen* for animals.

Because the generator knows each sentence's structure, it also gives **gold
syntactic annotations** of the English side (`embedded_annotations`: words,
UD UPOS tags, a UD dependency tree and a Penn-style constituency tree per
sentence; conventions in the table before `annotate`), and
`write_embedded_conllu` writes the corpus as a directory of CoNLL-U sources.

The generator is deterministic for a seed (it only uses its own
``random.Random(seed)``) and takes well under a second.  English sentences are
distinct across the whole corpus, and no German sentence of the valid/test
splits appears in the training split, so the held-out BLEU measures
generalisation to unseen sentences built from the same vocabulary and rules.
"""

from __future__ import annotations

import functools
import os
import pathlib
import random
from dataclasses import dataclass

from keras_transformer.data.syntax import AnnotatedSentence, linearise, parse_bracketed, to_conllu

SOURCE_LANG = "en"
TARGET_LANG = "de"

TRAIN_SIZE = 30_000
VALID_SIZE = 500
TEST_SIZE = 500
MAX_WORDS = 14  # longest English sentence, in words

# --------------------------------------------------------------------------
# Lexicon
# --------------------------------------------------------------------------

# English singular -> (English plural, German singular, German plural, gender, tags).
# Tags drive which verbs/adjectives a noun goes with: P person, A animal,
# F food, R readable, W writable, S small/portable, phys physical object, ...
_NOUN_ROWS = [
    # people
    ("man", "men", "Mann", "Männer", "m", "P"),
    ("woman", "women", "Frau", "Frauen", "f", "P"),
    ("child", "children", "Kind", "Kinder", "n", "P"),
    ("girl", "girls", "Mädchen", "Mädchen", "n", "P"),
    ("teacher", "teachers", "Lehrer", "Lehrer", "m", "P"),
    ("doctor", "doctors", "Arzt", "Ärzte", "m", "P"),
    ("friend", "friends", "Freund", "Freunde", "m", "P"),
    ("sister", "sisters", "Schwester", "Schwestern", "f", "P"),
    ("brother", "brothers", "Bruder", "Brüder", "m", "P"),
    ("mother", "mothers", "Mutter", "Mütter", "f", "P"),
    ("father", "fathers", "Vater", "Väter", "m", "P"),
    ("baker", "bakers", "Bäcker", "Bäcker", "m", "P"),
    ("king", "kings", "König", "Könige", "m", "P"),
    ("queen", "queens", "Königin", "Königinnen", "f", "P"),
    ("grandmother", "grandmothers", "Großmutter", "Großmütter", "f", "P"),
    ("pupil", "pupils", "Schüler", "Schüler", "m", "P"),
    # animals
    ("dog", "dogs", "Hund", "Hunde", "m", "A phys"),
    ("cat", "cats", "Katze", "Katzen", "f", "A phys"),
    ("horse", "horses", "Pferd", "Pferde", "n", "A phys"),
    ("bird", "birds", "Vogel", "Vögel", "m", "A phys"),
    ("mouse", "mice", "Maus", "Mäuse", "f", "A phys"),
    ("cow", "cows", "Kuh", "Kühe", "f", "A phys"),
    # things
    ("apple", "apples", "Apfel", "Äpfel", "m", "F S phys throw buy"),
    ("cake", "cakes", "Kuchen", "Kuchen", "m", "F phys buy"),
    ("bread", "breads", "Brot", "Brote", "n", "F phys buy"),
    ("soup", "soups", "Suppe", "Suppen", "f", "F cook"),
    ("egg", "eggs", "Ei", "Eier", "n", "F S phys cook throw buy"),
    ("book", "books", "Buch", "Bücher", "n", "R W S phys buy open close"),
    ("letter", "letters", "Brief", "Briefe", "m", "R W S phys open"),
    ("newspaper", "newspapers", "Zeitung", "Zeitungen", "f", "R S phys buy"),
    ("story", "stories", "Geschichte", "Geschichten", "f", "R W"),
    ("song", "songs", "Lied", "Lieder", "n", "W"),
    ("picture", "pictures", "Bild", "Bilder", "n", "phys S buy paint"),
    ("table", "tables", "Tisch", "Tische", "m", "phys furn buy build repair paint"),
    ("chair", "chairs", "Stuhl", "Stühle", "m", "phys furn buy build repair paint"),
    ("bed", "beds", "Bett", "Betten", "n", "phys furn buy build"),
    ("door", "doors", "Tür", "Türen", "f", "phys open close repair paint"),
    ("window", "windows", "Fenster", "Fenster", "n", "phys open close repair"),
    ("car", "cars", "Auto", "Autos", "n", "phys veh buy wash repair"),
    ("bicycle", "bicycles", "Fahrrad", "Fahrräder", "n", "phys veh buy wash repair"),
    ("boat", "boats", "Boot", "Boote", "n", "phys veh buy build repair paint"),
    ("house", "houses", "Haus", "Häuser", "n", "phys buy build paint"),
    ("cup", "cups", "Tasse", "Tassen", "f", "phys S dish buy"),
    ("glass", "glasses", "Glas", "Gläser", "n", "phys S dish buy"),
    ("plate", "plates", "Teller", "Teller", "m", "phys S dish buy"),
    ("bottle", "bottles", "Flasche", "Flaschen", "f", "phys S open buy"),
    ("spoon", "spoons", "Löffel", "Löffel", "m", "phys S dish"),
    ("knife", "knives", "Messer", "Messer", "n", "phys S dish buy"),
    ("pot", "pots", "Topf", "Töpfe", "m", "phys S dish buy"),
    ("key", "keys", "Schlüssel", "Schlüssel", "m", "phys S"),
    ("bag", "bags", "Tasche", "Taschen", "f", "phys S open close buy unpack"),
    ("box", "boxes", "Kiste", "Kisten", "f", "phys S open close build unpack"),
    ("ball", "balls", "Ball", "Bälle", "m", "phys S throw buy"),
    ("hat", "hats", "Hut", "Hüte", "m", "phys S cloth buy"),
    ("coat", "coats", "Mantel", "Mäntel", "m", "phys cloth buy"),
    ("shirt", "shirts", "Hemd", "Hemden", "n", "phys cloth buy"),
    ("shoe", "shoes", "Schuh", "Schuhe", "m", "phys S cloth buy"),
    ("dress", "dresses", "Kleid", "Kleider", "n", "phys cloth buy"),
    ("lamp", "lamps", "Lampe", "Lampen", "f", "phys S switch buy repair"),
    ("clock", "clocks", "Uhr", "Uhren", "f", "phys S buy repair"),
    ("flower", "flowers", "Blume", "Blumen", "f", "phys S buy paint"),
    ("tree", "trees", "Baum", "Bäume", "m", "phys paint"),
    ("pen", "pens", "Stift", "Stifte", "m", "phys S buy"),
    ("gift", "gifts", "Geschenk", "Geschenke", "n", "phys S buy open unpack"),
]

# English modifier -> the form German uses as the first part of a compound
# (with its linking element: Küche-n-, Geburtstag-s-, Bild-er-, ...).
_MODIFIERS = {
    "apple": "Apfel", "kitchen": "Küchen", "house": "Haus", "garden": "Garten",
    "flower": "Blumen", "coffee": "Kaffee", "tea": "Tee", "wine": "Wein",
    "water": "Wasser", "milk": "Milch", "school": "Schul", "picture": "Bilder",
    "soup": "Suppen", "bread": "Brot", "birthday": "Geburtstags", "fish": "Fisch",
    "door": "Tür", "car": "Auto", "table": "Tisch", "sun": "Sonnen",
    "glass": "Glas", "tomato": "Tomaten",
}

# Compounds (modifier, head); gender, plural and tags come from the head.
_COMPOUNDS = [
    ("apple", "tree"), ("apple", "cake"), ("kitchen", "table"), ("kitchen", "door"),
    ("kitchen", "window"), ("kitchen", "chair"), ("kitchen", "lamp"), ("kitchen", "knife"),
    ("house", "key"), ("house", "door"), ("garden", "table"), ("garden", "chair"),
    ("garden", "door"), ("flower", "pot"), ("coffee", "cup"), ("tea", "cup"),
    ("wine", "glass"), ("wine", "bottle"), ("water", "bottle"), ("water", "glass"),
    ("milk", "bottle"), ("school", "bag"), ("school", "book"), ("picture", "book"),
    ("soup", "spoon"), ("soup", "pot"), ("bread", "knife"), ("birthday", "cake"),
    ("birthday", "gift"), ("car", "key"), ("door", "key"), ("table", "lamp"),
    ("sun", "hat"), ("glass", "door"), ("fish", "soup"), ("tomato", "soup"),
]


@dataclass(frozen=True)
class _Noun:
    en_sg: str
    en_pl: str
    de_sg: str
    de_pl: str
    gender: str  # "m" | "f" | "n"
    tags: frozenset
    compound: bool = False


def _build_nouns() -> dict[str, _Noun]:
    nouns = {}
    for en_sg, en_pl, de_sg, de_pl, gender, tags in _NOUN_ROWS:
        nouns[en_sg] = _Noun(en_sg, en_pl, de_sg, de_pl, gender, frozenset(tags.split()))
    for mod, head in _COMPOUNDS:
        h = nouns[head]
        nouns[f"{mod} {head}"] = _Noun(
            en_sg=f"{mod} {h.en_sg}", en_pl=f"{mod} {h.en_pl}",
            de_sg=_MODIFIERS[mod] + h.de_sg.lower(), de_pl=_MODIFIERS[mod] + h.de_pl.lower(),
            gender=h.gender, tags=h.tags, compound=True)
    return nouns


NOUNS = _build_nouns()

# English -> (German stem, tags it applies to, tags it must not apply to).
_ADJECTIVES = {
    "big": ("groß", {"P", "A", "phys"}, set()),
    "small": ("klein", {"P", "A", "phys"}, set()),
    "old": ("alt", {"P", "A", "phys", "W"}, {"F"}),
    "new": ("neu", {"phys", "W"}, {"F", "A", "P"}),
    "young": ("jung", {"P", "A"}, set()),
    "hungry": ("hungrig", {"P", "A"}, set()),
    "beautiful": ("schön", {"P", "A", "phys", "W"}, set()),
    "good": ("gut", {"P", "A", "R", "W", "F"}, set()),
    "cheap": ("billig", {"buy"}, {"A", "P"}),
    "heavy": ("schwer", {"S", "furn"}, {"F", "R"}),
    "red": ("rot", {"phys"}, {"A", "P", "F"}),
    "green": ("grün", {"phys"}, {"A", "P", "F"}),
    "blue": ("blau", {"phys"}, {"A", "P", "F"}),
    "white": ("weiß", {"phys"}, {"P", "F"}),
    "black": ("schwarz", {"phys"}, {"P", "F"}),
    "brown": ("braun", {"phys"}, {"P", "F"}),
}


def _adjective_fits(adj: str, noun: _Noun) -> bool:
    _, allowed, excluded = _ADJECTIVES[adj]
    return bool(noun.tags & allowed) and not (noun.tags & excluded)


# Determiner tables: (case, gender or "pl") -> (article or "", adjective ending).
_DE_DETERMINERS = {
    "def": {("nom", "m"): ("der", "e"), ("nom", "f"): ("die", "e"), ("nom", "n"): ("das", "e"),
            ("nom", "pl"): ("die", "en"),
            ("acc", "m"): ("den", "en"), ("acc", "f"): ("die", "e"), ("acc", "n"): ("das", "e"),
            ("acc", "pl"): ("die", "en")},
    "dem": {("nom", "m"): ("dieser", "e"), ("nom", "f"): ("diese", "e"),
            ("nom", "n"): ("dieses", "e"), ("nom", "pl"): ("diese", "en"),
            ("acc", "m"): ("diesen", "en"), ("acc", "f"): ("diese", "e"),
            ("acc", "n"): ("dieses", "e"), ("acc", "pl"): ("diese", "en")},
    # ein has no plural: bare plural nouns take strong adjective endings.
    "indef": {("nom", "m"): ("ein", "er"), ("nom", "f"): ("eine", "e"), ("nom", "n"): ("ein", "es"),
              ("nom", "pl"): ("", "e"),
              ("acc", "m"): ("einen", "en"), ("acc", "f"): ("eine", "e"),
              ("acc", "n"): ("ein", "es"), ("acc", "pl"): ("", "e")},
}


def _possessive_table(stem: str) -> dict:
    return {("nom", "m"): (stem, "er"), ("nom", "f"): (stem + "e", "e"), ("nom", "n"): (stem, "es"),
            ("nom", "pl"): (stem + "e", "en"),
            ("acc", "m"): (stem + "en", "en"), ("acc", "f"): (stem + "e", "e"),
            ("acc", "n"): (stem, "es"), ("acc", "pl"): (stem + "e", "en")}


_DE_DETERMINERS["poss"] = _possessive_table("mein")
_DE_DETERMINERS["neg"] = _possessive_table("kein")  # kein declines like mein

# English determiner -> German determiner class.
_DET_CLASS = {"the": "def", "a": "indef", "my": "poss", "this": "dem"}

# Subject pronouns: English -> (German, person index 0=1sg 1=2sg 2=3sg 3=pl).
PRONOUNS = {"I": ("ich", 0), "you": ("du", 1), "he": ("er", 2), "she": ("sie", 2),
            "we": ("wir", 3), "they": ("sie", 3)}

_HABEN = ("habe", "hast", "hat", "haben")
_WERDEN = ("werde", "wirst", "wird", "werden")


@dataclass(frozen=True)
class _Verb:
    en: tuple  # (base, 3sg present, past, past participle)
    particle: str  # English particle after the verb ("up" in "picks up"), or ""
    de_inf: str  # German infinitive without separable prefix
    de_forms: tuple  # present: ich, du, er/sie/es, wir/sie
    de_part: str  # German past participle (with prefix)
    prefix: str  # German separable prefix, or ""
    objects: frozenset  # noun tags the object may have
    animal_subject: bool = False


def _v(en, de_inf, de_forms, de_part, objects, particle="", prefix="", animal=False):
    return _Verb(tuple(en.split()), particle, de_inf, tuple(de_forms.split()), de_part, prefix,
                 frozenset(objects.split()), animal)


VERBS = {
    "see": _v("see sees saw seen", "sehen", "sehe siehst sieht sehen", "gesehen",
              "P A phys", animal=True),
    "look at": _v("look looks looked looked", "sehen", "sehe siehst sieht sehen", "angesehen",
                  "P A phys", particle="at", prefix="an", animal=True),
    "look for": _v("look looks looked looked", "suchen", "suche suchst sucht suchen", "gesucht",
                   "P A S cloth", particle="for", animal=True),
    "visit": _v("visit visits visited visited", "besuchen", "besuche besuchst besucht besuchen",
                "besucht", "P"),
    "meet": _v("meet meets met met", "treffen", "treffe triffst trifft treffen", "getroffen", "P"),
    "love": _v("love loves loved loved", "lieben", "liebe liebst liebt lieben", "geliebt",
               "P A", animal=True),
    "feed": _v("feed feeds fed fed", "füttern", "füttere fütterst füttert füttern", "gefüttert",
               "A"),
    "buy": _v("buy buys bought bought", "kaufen", "kaufe kaufst kauft kaufen", "gekauft",
              "buy A"),
    "sell": _v("sell sells sold sold", "verkaufen", "verkaufe verkaufst verkauft verkaufen",
               "verkauft", "buy A"),
    "read": _v("read reads read read", "lesen", "lese liest liest lesen", "gelesen", "R"),
    "write": _v("write writes wrote written", "schreiben", "schreibe schreibst schreibt schreiben",
                "geschrieben", "W"),
    "eat": _v("eat eats ate eaten", "essen", "esse isst isst essen", "gegessen", "F",
              animal=True),
    "cook": _v("cook cooks cooked cooked", "kochen", "koche kochst kocht kochen", "gekocht",
               "cook"),
    "find": _v("find finds found found", "finden", "finde findest findet finden", "gefunden",
               "S A cloth", animal=True),
    "lose": _v("lose loses lost lost", "verlieren", "verliere verlierst verliert verlieren",
               "verloren", "S"),
    "take": _v("take takes took taken", "nehmen", "nehme nimmst nimmt nehmen", "genommen", "S F"),
    "carry": _v("carry carries carried carried", "tragen", "trage trägst trägt tragen",
                "getragen", "S furn"),
    "open": _v("open opens opened opened", "öffnen", "öffne öffnest öffnet öffnen", "geöffnet",
               "open"),
    "close": _v("close closes closed closed", "schließen", "schließe schließt schließt schließen",
                "geschlossen", "close"),
    "wash": _v("wash washes washed washed", "waschen", "wasche wäschst wäscht waschen",
               "gewaschen", "dish cloth veh A"),
    "paint": _v("paint paints painted painted", "malen", "male malst malt malen", "gemalt",
                "paint"),
    "bring": _v("bring brings brought brought", "bringen", "bringe bringst bringt bringen",
                "gebracht", "S F"),
    "repair": _v("repair repairs repaired repaired", "reparieren",
                 "repariere reparierst repariert reparieren", "repariert", "repair"),
    "build": _v("build builds built built", "bauen", "baue baust baut bauen", "gebaut", "build"),
    "throw": _v("throw throws threw thrown", "werfen", "werfe wirfst wirft werfen", "geworfen",
                "throw"),
    # separable verbs: the prefix goes to the end of a main clause
    "pick up": _v("pick picks picked picked", "heben", "hebe hebst hebt heben", "aufgehoben",
                  "S", particle="up", prefix="auf"),
    "throw away": _v("throw throws threw thrown", "werfen", "werfe wirfst wirft werfen",
                     "weggeworfen", "S F", particle="away", prefix="weg"),
    "put on": _v("put puts put put", "ziehen", "ziehe ziehst zieht ziehen", "angezogen", "cloth",
                 particle="on", prefix="an"),
    "take off": _v("take takes took taken", "ziehen", "ziehe ziehst zieht ziehen", "ausgezogen",
                   "cloth", particle="off", prefix="aus"),
    "switch on": _v("switch switches switched switched", "schalten",
                    "schalte schaltest schaltet schalten", "eingeschaltet", "switch",
                    particle="on", prefix="ein"),
    "bring back": _v("bring brings brought brought", "bringen", "bringe bringst bringt bringen",
                     "zurückgebracht", "S", particle="back", prefix="zurück"),
    "unpack": _v("unpack unpacks unpacked unpacked", "packen", "packe packst packt packen",
                 "ausgepackt", "unpack", prefix="aus"),
}

# Animals do not "essen", they "fressen".
_FRESSEN = _v("eat eats ate eaten", "fressen", "fresse frisst frisst fressen", "gefressen", "F")

# Verbs of saying/thinking that take a dass-clause (present tense only).
SPEECH_VERBS = {
    "say": (("say", "says"), ("sage", "sagst", "sagt", "sagen")),
    "think": (("think", "thinks"), ("denke", "denkst", "denkt", "denken")),
    "know": (("know", "knows"), ("weiß", "weißt", "weiß", "wissen")),
    "hope": (("hope", "hopes"), ("hoffe", "hoffst", "hofft", "hoffen")),
}

# Fronted time adverbials, by the tense they go with (English "past" -> German Perfekt).
TIME_ADVERBS = {
    "present": {"today": "heute", "now": "jetzt", "sometimes": "manchmal",
                "every day": "jeden Tag", "in the morning": "morgens",
                "in the evening": "abends"},
    "past": {"yesterday": "gestern", "last week": "letzte Woche", "last year": "letztes Jahr",
             "this morning": "heute Morgen"},
    "future": {"tomorrow": "morgen", "next week": "nächste Woche", "soon": "bald",
               "next year": "nächstes Jahr"},
}
_ADVERB_DE = {en: de for table in TIME_ADVERBS.values() for en, de in table.items()}

PLACES = {"in the garden": "im Garten", "in the kitchen": "in der Küche",
          "in the park": "im Park", "at school": "in der Schule", "at home": "zu Hause",
          "in the city": "in der Stadt", "at the station": "am Bahnhof",
          "in the forest": "im Wald"}

CONJUNCTIONS = {"because": "weil", "although": "obwohl", "while": "während", "if": "wenn",
                "when": "wenn", "that": "dass"}

TENSES = ("present", "past", "perfect", "future")

# --------------------------------------------------------------------------
# Phrases and clauses
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class NP:
    """A noun phrase: determiner ("the" | "a" | "my" | "this"), optional adjective."""
    noun: str
    det: str = "the"
    plural: bool = False
    adj: str | None = None


@dataclass(frozen=True)
class Clause:
    """Subject (an NP or an English pronoun), verb, accusative object and modifiers."""
    subject: NP | str
    verb: str
    obj: NP
    tense: str = "present"  # present | past (English simple past) | perfect | future
    negated: bool = False
    place: str | None = None


def _np_en(np: NP) -> str:
    noun = NOUNS[np.noun]
    words = []
    if np.det == "a":
        if not np.plural:
            words.append("a")
    elif np.det == "this":
        words.append("these" if np.plural else "this")
    else:
        words.append(np.det)
    if np.adj:
        words.append(np.adj)
    words.append(noun.en_pl if np.plural else noun.en_sg)
    if words[0] == "a" and words[1][0] in "aeio":
        words[0] = "an"
    return " ".join(words)


def _uses_kein(np: NP) -> bool:
    """Negating an indefinite (or bare plural) object uses kein, not nicht."""
    return np.det == "a"


def _np_de(np: NP, case: str, negated: bool = False) -> str:
    noun = NOUNS[np.noun]
    det_class = _DET_CLASS[np.det]
    if negated and _uses_kein(np):
        det_class = "neg"
    article, ending = _DE_DETERMINERS[det_class][(case, "pl" if np.plural else noun.gender)]
    words = [article] if article else []
    if np.adj:
        words.append(_ADJECTIVES[np.adj][0] + ending)
    words.append(noun.de_pl if np.plural else noun.de_sg)
    return " ".join(words)


def _person(subject: NP | str) -> int:
    if isinstance(subject, str):
        return PRONOUNS[subject][1]
    return 3 if subject.plural else 2


def _subject_en(subject: NP | str) -> str:
    return subject if isinstance(subject, str) else _np_en(subject)


def _subject_de(subject: NP | str) -> str:
    return PRONOUNS[subject][0] if isinstance(subject, str) else _np_de(subject, "nom")


def _is_animal(subject: NP | str) -> bool:
    return not isinstance(subject, str) and "A" in NOUNS[subject.noun].tags


def _de_verb(c: Clause) -> _Verb:
    if c.verb == "eat" and _is_animal(c.subject):
        return _FRESSEN
    return VERBS[c.verb]


def _en_present(c: Clause) -> str:
    base, s3 = VERBS[c.verb].en[:2]
    return s3 if _person(c.subject) == 2 else base


def _en_verb_group(c: Clause, question: bool = False) -> tuple[str | None, str]:
    """(auxiliary or None, main verb form) of the clause's English verb group."""
    base, _, past, pp = VERBS[c.verb].en
    third = _person(c.subject) == 2
    if c.tense == "present":
        if c.negated or question:
            return ("does" if third else "do"), base
        return None, _en_present(c)
    if c.tense == "past":
        return ("did", base) if (c.negated or question) else (None, past)
    if c.tense == "perfect":
        return ("has" if third else "have"), pp
    return "will", base


def _en_clause(c: Clause, question: bool = False) -> list[str]:
    """English words of the clause; a question inverts the auxiliary and the subject."""
    verb = VERBS[c.verb]
    aux, main = _en_verb_group(c, question)
    subj = _subject_en(c.subject)
    tail = [main] + ([verb.particle] if verb.particle else []) + [_np_en(c.obj)]
    if c.place:
        tail.append(c.place)
    if question:
        return [aux, subj] + tail
    head = [subj] + ([aux] if aux else []) + (["not"] if c.negated else [])
    return head + tail


def _de_parts(c: Clause) -> tuple[str, str, list[str], list[str], str]:
    """German (subject, finite verb, middle field, main-clause end, verb-final cluster)."""
    verb = _de_verb(c)
    p = _person(c.subject)
    middle = [_np_de(c.obj, "acc", c.negated)]
    if c.place:
        middle.append(PLACES[c.place])
    if c.negated and not _uses_kein(c.obj):
        middle.append("nicht")
    infinitive = verb.prefix + verb.de_inf
    if c.tense == "present":
        finite = verb.de_forms[p]
        end = [verb.prefix] if verb.prefix else []
        final = verb.prefix + finite
    elif c.tense in ("past", "perfect"):
        finite, end = _HABEN[p], [verb.de_part]
        final = f"{verb.de_part} {finite}"
    else:
        finite, end = _WERDEN[p], [infinitive]
        final = f"{infinitive} {finite}"
    return _subject_de(c.subject), finite, middle, end, final


def de_main(c: Clause, adverb: str | None = None) -> str:
    """Main clause, verb second; a fronted adverb swaps subject and finite verb."""
    subj, finite, middle, end, _ = _de_parts(c)
    if adverb:
        return " ".join([_ADVERB_DE[adverb], finite, subj, *middle, *end])
    return " ".join([subj, finite, *middle, *end])


def de_inverted(c: Clause) -> str:
    """Verb-first order: yes/no questions and main clauses after a fronted subordinate clause."""
    subj, finite, middle, end, _ = _de_parts(c)
    return " ".join([finite, subj, *middle, *end])


def de_subordinate(c: Clause) -> str:
    """Verb-final order (without the conjunction)."""
    subj, _, middle, _, final = _de_parts(c)
    return " ".join([subj, *middle, final])


def _sentence(words: str, punct: str) -> str:
    return words[0].upper() + words[1:] + punct


# Sentence builders: each returns (english, german).

def simple(c: Clause, adverb: str | None = None) -> tuple[str, str]:
    en = " ".join(([adverb] if adverb else []) + _en_clause(c))
    return _sentence(en, "."), _sentence(de_main(c, adverb), ".")


def question(c: Clause) -> tuple[str, str]:
    return _sentence(" ".join(_en_clause(c, question=True)), "?"), _sentence(de_inverted(c), "?")


def with_subordinate(main: Clause, conj: str, sub: Clause,
                     adverb: str | None = None) -> tuple[str, str]:
    """"Main conj sub." → "Main, conj sub-verb-final." """
    en = " ".join(([adverb] if adverb else []) + _en_clause(main) + [conj] + _en_clause(sub))
    de = f"{de_main(main, adverb)}, {CONJUNCTIONS[conj]} {de_subordinate(sub)}"
    return _sentence(en, "."), _sentence(de, ".")


def fronted_subordinate(conj: str, sub: Clause, main: Clause) -> tuple[str, str]:
    """"Conj sub, main." → "Conj sub-verb-final, verb main." """
    en = " ".join([conj] + _en_clause(sub)) + ", " + " ".join(_en_clause(main))
    de = f"{CONJUNCTIONS[conj]} {de_subordinate(sub)}, {de_inverted(main)}"
    return _sentence(en, "."), _sentence(de, ".")


def reported(subject: NP | str, speech_verb: str, sub: Clause) -> tuple[str, str]:
    """"X says that sub." → "X sagt, dass sub-verb-final." """
    (base, s3), de_forms = SPEECH_VERBS[speech_verb]
    p = _person(subject)
    en = " ".join([_subject_en(subject), s3 if p == 2 else base, "that"] + _en_clause(sub))
    de = f"{_subject_de(subject)} {de_forms[p]}, dass {de_subordinate(sub)}"
    return _sentence(en, "."), _sentence(de, ".")


# --------------------------------------------------------------------------
# Random generation
# --------------------------------------------------------------------------

_PEOPLE = [k for k, n in NOUNS.items() if "P" in n.tags]
_ANIMALS = [k for k, n in NOUNS.items() if "A" in n.tags]
_VERB_KEYS = list(VERBS)
_OBJECTS = {
    v: ([k for k, n in NOUNS.items() if not n.compound and n.tags & VERBS[v].objects],
        [k for k, n in NOUNS.items() if n.compound and n.tags & VERBS[v].objects])
    for v in VERBS
}
_ADJ_FOR = {k: [a for a in _ADJECTIVES if _adjective_fits(a, n)] for k, n in NOUNS.items()}
_PRONOUN_KEYS = list(PRONOUNS)
_PLACE_KEYS = list(PLACES)
_DETS = ("the", "a", "my", "this")
_DET_CUM_WEIGHTS = (5, 7, 9, 10)


class _Generator:
    def __init__(self, seed: int):
        self.r = random.Random(seed)
        self.last: tuple | None = None  # (builder kind, builder args) of the last sentence

    def np(self, noun: str, adj_p: float) -> NP:
        r = self.r
        det = r.choices(_DETS, cum_weights=_DET_CUM_WEIGHTS)[0]
        adjs = _ADJ_FOR[noun]
        adj = r.choice(adjs) if adjs and r.random() < adj_p else None
        return NP(noun, det, r.random() < 0.3, adj)

    def clause(self, adj_p: float = 0.3, place_p: float = 0.15, neg_p: float = 0.15,
               tenses: tuple = TENSES, tense_weights: tuple = (9, 4, 4, 3),
               allow_pronoun: bool = True, verb: str | None = None) -> Clause:
        r = self.r
        verb = verb or r.choice(_VERB_KEYS)
        v = VERBS[verb]
        if allow_pronoun and r.random() < 0.3:
            subject = r.choice(_PRONOUN_KEYS)
        else:
            pool = _PEOPLE + _ANIMALS if v.animal_subject and r.random() < 0.5 else _PEOPLE
            subject = self.np(r.choice(pool), adj_p)
        simple_nouns, compounds = _OBJECTS[verb]
        pool = compounds if compounds and r.random() < 0.25 else simple_nouns
        obj = self.np(r.choice(pool), adj_p)
        negated = r.random() < neg_p
        place = r.choice(_PLACE_KEYS) if not negated and r.random() < place_p else None
        while True:
            tense = r.choices(tenses, tense_weights[:len(tenses)])[0]
            c = Clause(subject, verb, obj, tense, negated, place)
            # "I read the book" / "we put on hats": the simple past would look
            # like the present, making the English ambiguous -- use another tense.
            if not (tense == "past" and not negated and v.en[2] == _en_present(c)):
                return c

    def _build(self, kind: str, *args) -> tuple[str, str]:
        """The sentence builder `kind` applied to `args`; remembers both in `last`
        (what `annotate` needs to annotate the sentence)."""
        self.last = (kind, args)
        return _BUILDERS[kind](*args)

    def sentence(self) -> tuple[str, str]:
        r = self.r
        kind = r.choices(("simple", "question", "sub", "fronted", "reported"),
                         (45, 12, 17, 12, 14))[0]
        if kind == "simple":
            c = self.clause()
            adverb = None
            if c.tense != "perfect" and r.random() < 0.35:
                adverb = r.choice(list(TIME_ADVERBS[c.tense]))
            return self._build("simple", c, adverb)
        if kind == "question":
            return self._build("question", self.clause(neg_p=0.0))
        if kind == "sub":
            conj = r.choice(("because", "because", "although", "while", "if", "when"))
            sub_tenses = TENSES if conj in ("because", "although") else ("present",)
            main_tenses = ("present", "future") if conj in ("if", "when", "while") else TENSES
            main = self.clause(0.15, 0.1, 0.1, main_tenses)
            sub = self.clause(0.15, 0.1, 0.15, sub_tenses)
            return self._build("with_subordinate", main, conj, sub)
        if kind == "fronted":
            conj = r.choice(("if", "when", "because", "although"))
            sub_tenses = TENSES if conj in ("because", "although") else ("present",)
            main_tenses = ("present", "future") if conj in ("if", "when") else TENSES
            sub = self.clause(0.15, 0.1, 0.1, sub_tenses)
            main = self.clause(0.15, 0.1, 0.1, main_tenses)
            return self._build("fronted_subordinate", conj, sub, main)
        speaker = r.choice(_PRONOUN_KEYS) if r.random() < 0.4 else self.np(r.choice(_PEOPLE), 0.15)
        return self._build("reported", speaker, r.choice(list(SPEECH_VERBS)), self.clause(0.2, 0.1, 0.15))


_BUILDERS = {"simple": simple, "question": question, "with_subordinate": with_subordinate,
             "fronted_subordinate": fronted_subordinate, "reported": reported}


def _n_words(sentence: str) -> int:
    return len(sentence.split())


def _generate_records(seed: int, train_size: int = TRAIN_SIZE, keep=None) -> tuple[list, list, list]:
    """(train, valid, test): the generation and selection of `_generate`.

    Each split holds, per sentence, ``keep(split, index, english, german,
    (builder kind, builder args))`` -- by default ``(english, german)``, so
    that no sentence structure stays alive (thousands of them would slow the
    generation down through garbage-collector passes).
    """
    gen = _Generator(seed)
    seen_en: set[str] = set()
    heldout_de: set[str] = set()
    test, valid, train = [], [], []
    while len(train) < train_size:
        en, de = gen.sentence()
        if en in seen_en or _n_words(en) > MAX_WORDS:
            continue
        if len(test) < TEST_SIZE or len(valid) < VALID_SIZE:
            seen_en.add(en)
            heldout_de.add(de)
            split, name = (test, "test") if len(test) < TEST_SIZE else (valid, "valid")
        elif de not in heldout_de:
            seen_en.add(en)
            split, name = train, "train"
        else:
            continue
        split.append((en, de) if keep is None else keep(name, len(split), en, de, gen.last))
    return train, valid, test


@functools.lru_cache(maxsize=4)
def _generate(seed: int, train_size: int = TRAIN_SIZE) -> tuple[tuple, tuple, tuple]:
    """(train, valid, test); a smaller ``train_size`` gives a prefix of the same stream."""
    return tuple(tuple(split) for split in _generate_records(seed, train_size))


def embedded_corpus(seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """Returns {"train": [...], "valid": [...], "test": [...]} of (english, german) pairs.

    Deterministic for a given ``seed``.  English sentences are distinct across
    all three splits and the German side of valid/test never occurs in train.
    """
    train, valid, test = _generate(seed)
    return {"train": list(train), "valid": list(valid), "test": list(test)}


# --------------------------------------------------------------------------
# Gold syntactic annotations of the English side
# --------------------------------------------------------------------------
#
# The grammar knows every sentence's structure, so it can annotate the English
# side exactly: words (punctuation split off), UD v2 UPOS tags, a UD basic
# dependency tree with universal relations (content words as heads), and a
# Penn-style constituency tree with the words as leaves directly under phrase
# labels.  The annotation is built alongside the words by the same steps as
# `_en_clause` and the sentence builders -- nothing is parsed.  Conventions:
#
#   construction                     dependency                      constituents
#   the/a/an/this/these + noun       DET det -> noun                 (NP the dog )
#   my + noun                        PRON nmod:poss -> noun          (NP my dog )
#   adjective                        ADJ amod -> noun                (NP the red ball )
#   "apple tree"                     NOUN compound -> tree           (NP the apple tree )
#   subject NP / pronoun             nsubj -> main verb              (S (NP ..) (VP ..) )
#   object NP                        obj -> main verb                (VP sees (NP ..) )
#   does/do/did/has/have/will        AUX aux -> main verb            (VP has (VP seen ..) )
#   not                              PART advmod -> main verb        (VP does not (VP see ..) )
#   particle "picks up"              ADP|ADV compound:prt -> verb    (VP picks (PRT up ) (NP ..) )
#   "looks at/for the dog"           ADP case -> dog, dog obl -> verb (VP looks (PP at (NP ..) ) )
#   place "in the garden"            ADP case, DET det -> garden,    (PP in (NP the garden ) ),
#                                    garden NOUN obl -> main verb    inside the main verb's VP
#   today/now/soon/...               ADV advmod -> main verb         (ADVP Today )
#   "every day"/"last week"          DET det / ADJ amod -> day,      (NP Every day )
#                                    day NOUN obl:tmod -> main verb
#   "in the morning"                 as a place: case, det, obl      (PP In (NP the morning ) )
#   because/although/while/if/when   SCONJ mark -> subordinate verb  (SBAR because (S ..) ), in the
#                                    subordinate verb advcl -> main  main verb's VP (or fronted
#                                    verb                            under S, before the comma)
#   says/thinks/knows/hopes that     speech verb VERB; "that" SCONJ  (VP says (SBAR that (S ..) ) )
#                                    mark; its verb ccomp -> speech verb
#   . ? ,                            PUNCT punct -> the root verb    directly under S / SQ
#   question                         Does AUX aux -> main verb       (SQ Does (NP ..) (VP see ..) ? )
#
# The root is the main clause's main verb (the speech verb in reported speech).

_PARTICLE_UPOS = {"up": "ADP", "on": "ADP", "off": "ADP", "away": "ADV", "back": "ADV"}
_PREPOSITIONAL_PARTICLES = {"at", "for"}  # "looks at/for X": X is an oblique with its preposition
# The words of TIME_ADVERBS and PLACES.
_ADVERBIAL_UPOS = {
    "in": "ADP", "at": "ADP", "the": "DET", "every": "DET", "this": "DET", "last": "ADJ", "next": "ADJ",
    "today": "ADV", "now": "ADV", "sometimes": "ADV", "yesterday": "ADV", "tomorrow": "ADV", "soon": "ADV",
    "day": "NOUN", "week": "NOUN", "year": "NOUN", "morning": "NOUN", "evening": "NOUN", "garden": "NOUN",
    "kitchen": "NOUN", "park": "NOUN", "school": "NOUN", "home": "NOUN", "city": "NOUN", "station": "NOUN",
    "forest": "NOUN"}
_MODIFIER_DEPREL = {"ADP": "case", "DET": "det", "ADJ": "amod"}
_NO_SPACE_BEFORE = frozenset(",.?")


class _Annotation:
    """One sentence being annotated: parallel per-word lists (heads as 0-based
    indices, filled in once the head is known).  Constituents are
    `(label, children)` with children word indices or constituents."""

    __slots__ = ("words", "upos", "deprel", "heads")

    def __init__(self):
        self.words: list[str] = []
        self.upos: list[str] = []
        self.deprel: list[str] = []
        self.heads: list[int] = []

    def add(self, word: str, upos: str, deprel: str = "", head: int = -1) -> int:
        self.words.append(word)
        self.upos.append(upos)
        self.deprel.append(deprel)
        self.heads.append(head)
        return len(self.words) - 1

    def attach(self, dependent: int, head: int, deprel: str | None = None) -> None:
        self.heads[dependent] = head
        if deprel is not None:
            self.deprel[dependent] = deprel

    def bracketed(self, node) -> str:
        label, children = node
        return " ".join([f"({label}"] + [self.words[c] if isinstance(c, int) else self.bracketed(c)
                                          for c in children] + [")"])

    def finish(self, root: int, label: str, children: list, punct: str, sent_id: str) -> AnnotatedSentence:
        children.append(self.add(punct, "PUNCT", "punct", root))
        self.attach(root, -1, "root")
        first = self.words[0]
        self.words[0] = first[0].upper() + first[1:]
        text = "".join(w if (i == 0 or w in _NO_SPACE_BEFORE) else " " + w for i, w in enumerate(self.words))
        return AnnotatedSentence(words=tuple(self.words), upos=tuple(self.upos), deprel=tuple(self.deprel),
                                 heads=tuple(self.heads), text=text, sent_id=sent_id,
                                 tree=self.bracketed((label, children)))


def _np_ann(a: _Annotation, np: NP) -> tuple[int, tuple]:
    """Adds the noun phrase's words (as `_np_en`); returns (its noun, its constituent)."""
    noun = NOUNS[np.noun]
    noun_words = (noun.en_pl if np.plural else noun.en_sg).split()
    dependents = []
    if np.det == "a":
        if not np.plural:
            following = np.adj or noun_words[0]
            dependents.append(a.add("an" if following[0] in "aeio" else "a", "DET", "det"))
    elif np.det == "this":
        dependents.append(a.add("these" if np.plural else "this", "DET", "det"))
    elif np.det == "my":
        dependents.append(a.add("my", "PRON", "nmod:poss"))
    else:
        dependents.append(a.add(np.det, "DET", "det"))
    if np.adj:
        dependents.append(a.add(np.adj, "ADJ", "amod"))
    dependents += [a.add(w, "NOUN", "compound") for w in noun_words[:-1]]  # "apple tree"
    head = a.add(noun_words[-1], "NOUN")
    for d in dependents:
        a.attach(d, head)
    return head, ("NP", dependents + [head])


def _subject_ann(a: _Annotation, subject: NP | str) -> tuple[int, tuple]:
    if isinstance(subject, str):
        i = a.add(subject, "PRON")
        return i, ("NP", [i])
    return _np_ann(a, subject)


def _adverbial_ann(a: _Annotation, phrase: str) -> tuple[int, tuple, str]:
    """A time adverbial or place: (its head word, its constituent, the head's relation to the verb)."""
    words = phrase.split()
    tags = [_ADVERBIAL_UPOS[w] for w in words]
    if tags[-1] == "ADV":
        i = a.add(words[0], "ADV")
        return i, ("ADVP", [i]), "advmod"
    indices = [a.add(w, t, _MODIFIER_DEPREL.get(t, "")) for w, t in zip(words, tags)]
    head = indices[-1]
    for i in indices[:-1]:
        a.attach(i, head)
    if tags[0] == "ADP":
        return head, ("PP", [indices[0], ("NP", indices[1:])]), "obl"
    return head, ("NP", indices), "obl:tmod"


def _clause_ann(a: _Annotation, c: Clause, question: bool = False) -> tuple[int, list, list]:
    """Adds the clause's words (as `_en_clause`).

    Returns (its main verb, the children of its S -- SQ for a question --,
    the children of the main verb's VP, where a subordinate clause goes)."""
    verb = VERBS[c.verb]
    aux, main_form = _en_verb_group(c, question)
    dependents = []  # (word, relation) of the main verb
    if question:
        dependents.append((a.add(aux, "AUX"), "aux"))
    subject, subject_node = _subject_ann(a, c.subject)
    dependents.append((subject, "nsubj"))
    if not question and aux:
        dependents.append((a.add(aux, "AUX"), "aux"))
    if c.negated:
        dependents.append((a.add("not", "PART"), "advmod"))
    main = a.add(main_form, "VERB")
    vp = [main]
    preposition = None
    if verb.particle in _PREPOSITIONAL_PARTICLES:
        preposition = a.add(verb.particle, "ADP", "case")
    elif verb.particle:
        particle = a.add(verb.particle, _PARTICLE_UPOS[verb.particle])
        dependents.append((particle, "compound:prt"))
        vp.append(("PRT", [particle]))
    obj, obj_node = _np_ann(a, c.obj)
    if preposition is None:
        dependents.append((obj, "obj"))
        vp.append(obj_node)
    else:
        a.attach(preposition, obj)
        dependents.append((obj, "obl"))
        vp.append(("PP", [preposition, obj_node]))
    if c.place:
        place, place_node, relation = _adverbial_ann(a, c.place)
        dependents.append((place, relation))
        vp.append(place_node)
    for word, relation in dependents:
        a.attach(word, main, relation)
    if question:
        return main, [dependents[0][0], subject_node, ("VP", vp)], vp
    verb_phrase = ("VP", vp)
    if aux:
        verb_phrase = ("VP", [dependents[1][0]] + ([dependents[2][0]] if c.negated else []) + [verb_phrase])
    return main, [subject_node, verb_phrase], vp


def _subordinate_ann(a: _Annotation, conj: str, sub: Clause) -> tuple[int, tuple]:
    """conj + clause: (the clause's verb, the SBAR); the conjunction is its mark."""
    mark = a.add(conj, "SCONJ")
    verb, children, _ = _clause_ann(a, sub)
    a.attach(mark, verb, "mark")
    return verb, ("SBAR", [mark, ("S", children)])


def _annotate_simple(a, sent_id, c, adverb=None):
    front = _adverbial_ann(a, adverb) if adverb else None
    verb, children, _ = _clause_ann(a, c)
    if front:
        a.attach(front[0], verb, front[2])
        children.insert(0, front[1])
    return a.finish(verb, "S", children, ".", sent_id)


def _annotate_question(a, sent_id, c):
    verb, children, _ = _clause_ann(a, c, question=True)
    return a.finish(verb, "SQ", children, "?", sent_id)


def _annotate_with_subordinate(a, sent_id, main, conj, sub, adverb=None):
    front = _adverbial_ann(a, adverb) if adverb else None
    verb, children, vp = _clause_ann(a, main)
    if front:
        a.attach(front[0], verb, front[2])
        children.insert(0, front[1])
    sub_verb, sbar = _subordinate_ann(a, conj, sub)
    a.attach(sub_verb, verb, "advcl")
    vp.append(sbar)
    return a.finish(verb, "S", children, ".", sent_id)


def _annotate_fronted_subordinate(a, sent_id, conj, sub, main):
    sub_verb, sbar = _subordinate_ann(a, conj, sub)
    comma = a.add(",", "PUNCT")
    verb, children, _ = _clause_ann(a, main)
    a.attach(sub_verb, verb, "advcl")
    a.attach(comma, verb, "punct")
    return a.finish(verb, "S", [sbar, comma] + children, ".", sent_id)


def _annotate_reported(a, sent_id, subject, speech_verb, sub):
    (base, s3), _ = SPEECH_VERBS[speech_verb]
    subj, subject_node = _subject_ann(a, subject)
    verb = a.add(s3 if _person(subject) == 2 else base, "VERB")
    a.attach(subj, verb, "nsubj")
    sub_verb, sbar = _subordinate_ann(a, "that", sub)
    a.attach(sub_verb, verb, "ccomp")
    return a.finish(verb, "S", [subject_node, ("VP", [verb, sbar])], ".", sent_id)


_ANNOTATORS = {"simple": _annotate_simple, "question": _annotate_question,
               "with_subordinate": _annotate_with_subordinate,
               "fronted_subordinate": _annotate_fronted_subordinate, "reported": _annotate_reported}


def annotate(kind: str, *args, sent_id: str = "") -> AnnotatedSentence:
    """Gold annotation of the English sentence that the builder `kind` makes of `args`.

    `kind` names a sentence builder -- "simple", "question", "with_subordinate",
    "fronted_subordinate" or "reported" -- and `args` are that builder's
    arguments: `annotate("simple", c, "today").text == simple(c, "today")[0]`.
    """
    return _ANNOTATORS[kind](_Annotation(), sent_id, *args)


@functools.lru_cache(maxsize=2)
def _annotated(seed: int, train_size: int) -> dict[str, tuple]:
    """{split: ((AnnotatedSentence, german), ...)}, the order of `_generate(seed, train_size)`."""

    def keep(split, index, en, de, structure):
        kind, args = structure
        return annotate(kind, *args, sent_id=f"{split}-{index}"), de

    train, valid, test = _generate_records(seed, train_size, keep)
    return {"train": tuple(train), "valid": tuple(valid), "test": tuple(test)}


def embedded_annotations(seed: int = 0, train_size: int = TRAIN_SIZE) -> dict[str, list[AnnotatedSentence]]:
    """Gold annotations of the English side of `embedded_corpus(seed)`.

    Returns {"train", "valid", "test"} lists of `AnnotatedSentence`, one per
    pair of the corpus split, in its order (`sent_id` "train-0", ...); a
    smaller ``train_size`` annotates a prefix of the train split (valid and
    test are the same).  Conventions: the table before `annotate`.
    """
    return {name: [sentence for sentence, _ in items] for name, items in _annotated(seed, train_size).items()}


def write_embedded_conllu(directory: str | os.PathLike, seed: int = 0,
                          limit: int | None = None, trees: bool = False) -> list[pathlib.Path]:
    """Writes the corpus as a directory of CoNLL-U sources: `{split}.en.conllu`
    (`to_conllu` blocks, each followed by a blank line) and `{split}.de` (one
    German sentence a line) for train, valid and test.

    ``limit`` keeps the first ``limit`` sentences of each split.  With
    ``trees``, also `{split}.tree`: each English sentence's constituency tree
    linearised (`syntax.linearise`, one tree a line), a target side for
    parsing as sequence-to-sequence (survey section 3.1): `train.py --data
    DIRECTORY --source-lang en --target-lang tree`.  Returns the paths written.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    train_size = TRAIN_SIZE if limit is None else max(1, min(limit, TRAIN_SIZE))
    paths = []
    for name, items in _annotated(seed, train_size).items():
        items = items[:limit]
        conllu_path, de_path = directory / f"{name}.{SOURCE_LANG}.conllu", directory / f"{name}.{TARGET_LANG}"
        conllu_path.write_text("".join(to_conllu(sentence) + "\n\n" for sentence, _ in items), encoding="utf-8")
        de_path.write_text("".join(de + "\n" for _, de in items), encoding="utf-8")
        paths += [conllu_path, de_path]
        if trees:
            tree_path = directory / f"{name}.tree"
            tree_path.write_text("".join(" ".join(linearise(parse_bracketed(sentence.tree))) + "\n"
                                         for sentence, _ in items), encoding="utf-8")
            paths.append(tree_path)
    return paths


__all__ = ["embedded_corpus", "embedded_annotations", "write_embedded_conllu", "annotate",
           "SOURCE_LANG", "TARGET_LANG"]
