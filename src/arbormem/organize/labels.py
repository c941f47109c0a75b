"""Offline titles: short noun phrases a person would write, from bounded phrase counters.

No language model and no part-of-speech tagger (none ships offline on PyPI); instead the
classic stop-list chunker behind RAKE-style keyphrase extraction, with English word lists:

1. ``phrase_counts`` cuts one exchange's text into runs of content words. A run ends at
   punctuation, at a word with a digit, and at every word of the extended stop list: function
   words, common verbs in all their forms, adverbs, pleasantries ("thanks", "sounds",
   "awesome"), chat filler ("lol", "yeah"), number words, units. A few cheap rules catch
   verbs the list misses: a word after a subject pronoun or a modal ("we ride horses"), an
   "-ing" word after a form of "be" or before a determiner ("I'm planning a trip") or after
   a noun ("a bird flying"); an "-ed" word starts a new run and never ends a phrase ("Maya
   painted sunsets" gives "sunsets"); what a number measures ends one too ("a 4 year old
   girl", "3 minutes max"). Every 1-3 word window of a run is a candidate (so "half
   marathon" is counted both alone and inside "half marathon training"), except windows
   that start or end inside a hyphenated word ("second-hand Yamaha": never "hand Yamaha").
2. ``make_title`` scores each candidate by its frequency in the node (sub-linear) times the
   mean squashed inverse document frequency of its words over the user's whole memory,
   favouring multi-word phrases that recur as a whole; a word that is everywhere in the
   user's memory (a name, "photo") scores low. ``theme_title`` prefers phrases that several
   children share. docs/titles.md has the reasons and the measurements.

Counters are plain ``dict[str, int]``: mergeable by summation and prunable like the term
counters of ``text.py`` (``merge_counts``, ``prune_counts`` or ``prune_phrases`` here).
Phrase keys are lower-case words joined by single spaces. Keys holding an upper-case letter
are *case hints*, not phrases: one per capitalised word seen where capitals are not
grammatical (mid-sentence, or an acronym such as "CI"), counting those sightings, so that a
title can say "Lisbon", "Rust" or "CI" in any position. Hints merge and prune like the
rest; a pruned hint only costs the capital.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from operator import methodcaller

from ..text import STOPWORDS, idf

__all__ = [
    "MAX_TITLE_CHARS",
    "UNTITLED",
    "USER_WEIGHT",
    "exchange_phrase_counts",
    "is_phrase",
    "make_title",
    "merge_phrases",
    "opening_words",
    "phrase_counts",
    "phrase_words",
    "prune_phrases",
    "repeats",
    "says_more",
    "subtract_phrases",
    "theme_title",
]

MAX_WORDS = 3  # candidate phrase length
MAX_TITLE_CHARS = 40
PER_TEXT_CAP = 3  # one long exchange repeating a word must not outweigh a recurring phrase
UNTITLED = "Untitled"

_URL = re.compile(r"\b(?:https?://|www\.)\S+|\S+@\S+\.\w+", re.IGNORECASE)
# A speaker label at the start of a line ("Maria: ...", as transcripts with named participants
# are stored): one to three capitalised words and a colon.
_LABEL = re.compile(r"^[ \t]*[^\W\d_][\w.'’-]*(?: [^\W\d_][\w.'’-]*){0,2}:[ \t]", re.MULTILINE)
_HYPHEN = re.compile(r"(?<=[^\W_])[-‐](?=[^\W_])")
_TOKEN = re.compile(r"([^\W_]+(?:['’][^\W_]+)*)|([.!?;:…\n]+)|([^\w\s]|_)")


def _words(s: str) -> frozenset[str]:
    return frozenset(s.split())


# Verbs that are rarely nouns (nouns such as "plan", "run", "work", "change" are kept), with
# their regular forms generated below and the irregular ones listed.
_VERBS = _words(
    """accept accomplish achieve add admire admit adopt afford agree allow announce appear apply
    appreciate argue arrange arrive ask assume attach attend avoid bake become beg begin behave
    believe belong blame borrow bother break breathe bring build burn buy calm cancel carry catch
    cause celebrate cheer choose clean climb collect come compare compete complain complete
    concentrate confess confirm connect consider contain continue contribute convince cope could
    count cover create cry cut deal decide decorate define delete deliver depend describe deserve
    destroy determine develop die disagree disappear discover discuss dislike do donate doubt
    drag draw dream dress drink drive drop earn eat embrace emerge encourage end enjoy ensure
    enter escape examine exist expand expect experience explain explore express fail fall feel
    fight figure fill find finish fit fix focus fold follow forget forgive freak gain gather get
    give go grab greet grow guess handle hang happen hate have head hear help hide hit hold hope
    hug hurry hurt identify ignore imagine impress improve include increase inspire install
    intend introduce invite involve join joke jump keep kick kill kiss knock know laugh lay lead
    learn leave lend let lie lift listen live look lose love make manage marry matter may mean
    meet mention might mind miss motivate move must need nod notice obtain occur open
    organise organize overcome owe own paint pass pay perform pick pitch plant play pour practice
    practise pray prefer prepare pretend prevent print produce promise protect prove provide
    pull punch push put quit raise reach react read realize realise recall receive recognize
    recommend recover reduce refer reflect refuse regret relate relax release rely remain
    remember remind remove rent repair repeat replace reply report represent require rescue
    resolve respect respond retire return reveal ride ring rise rush save say scare scream search
    see seek seem sell send serve settle shake shall shine shoot should shout show shut sing sink
    sit sleep slip smell smile solve sound speak spend spill spoil stand stare start stay steal
    stick sting stop struggle study succeed suck suffer suggest suppose surprise survive swear
    swim take talk taste teach tear tell tend thank think throw tie tire touch train travel treat
    trust try turn understand upset use vote wait wake walk want warn wash waste watch wave wear
    welcome win wish wonder worry would write yell like brighten lighten strengthen widen
    soften loosen tighten flatten shorten threaten frighten sharpen weaken awaken broaden
    deepen harden heighten lengthen moisten sweeten worsen fasten hasten convey collaborate
    inform"""
) - _words("break change check cut deal dream drink end experience fall fight focus head hug "
           "joke kiss paint pitch plant play practice pray print report rescue ride ring sleep "
           "search smell smile study swim taste tie train travel trust vote walk wave work") \
    | _words("chat share")
_IRREGULAR = _words(
    """am is are was were been being has had having does did done doing went gone goes made
    said says took taken came saw seen thought knew known gave given found told felt left kept
    brought began begun built bought caught chose chosen drank drunk drove driven ate eaten fell
    fallen forgot forgotten forgave got gotten grew grown hung heard held hid hidden hit hurt
    laid led lent lay lain lost meant met paid put read rode rang rose risen sold sent set shown
    sat slept spoke spoken spent stood stuck taught threw thrown understood woke woken wore worn
    won wrote written lit let ran stung sang sung swam swum broke broken fought flew flown drew
    drawn shook shaken quit tore torn stole stolen sank sunk shot shut upset dealt dreamt burnt
    learnt spelt works named called titled entitled nicknamed"""
)


def _inflect(verb: str) -> set[str]:
    out = {verb}
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        out.add(verb + "es")
    elif verb.endswith("y") and verb[-2:-1] not in "aeiou":
        out.add(verb[:-1] + "ies")
    else:
        out.add(verb + "s")
    stem = verb[:-1] if verb.endswith("e") and not verb.endswith("ee") else verb
    if verb.endswith("y") and verb[-2:-1] not in "aeiou":
        out.add(verb[:-1] + "ied")
    else:
        out.add(verb + ("d" if verb.endswith("e") else "ed"))
    out.add(stem + "ing")
    # Consonant doubling of short verbs ("stop" -> "stopped", "plan" -> "planning").
    if len(verb) <= 4 and verb[-1] not in "aeiouwxy" and verb[-2:-1] in set("aeiou") \
            and verb[-3:-2] not in set("aeiou"):
        out.update({verb + verb[-1] + "ed", verb + verb[-1] + "ing"})
    return out


_VERB_FORMS = frozenset().union(*(_inflect(v) for v in _VERBS)) | _IRREGULAR

# Nouns the verb inflection above would otherwise swallow; "-ing" nouns are listed below.
_NOT_VERBS = _words("treats falls savings earnings findings lies fits")
# "-ing" words that are nouns or activities ("Reading", "Rock climbing"): content words,
# unless the "-ing" rule below finds them used as a verb ("I'm reading a book").
_ING_NOUNS = _words(
    """morning evening spring string king ring wing sibling ceiling pudding wedding building
    meeting painting clothing housing feeling feelings earring earrings offspring swing sling
    duckling dumpling darling stocking stuffing icing filling frosting lightning reading
    writing cooking baking learning drawing climbing singing teaching dancing hiking swimming
    camping fishing hunting skiing shopping gardening knitting sewing sailing boxing bowling
    jogging volunteering parenting dating running walking training cycling biking surfing
    skating traveling travelling recycling packing catering counseling counselling coaching
    tutoring mentoring printing recording sculpting acting modeling modelling marketing
    accounting engineering nursing programming coding hosting funding lodging parking
    plumbing roofing heating wiring flooring tiling landscaping budgeting saving investing
    banking trading fundraising networking brainstorming bullying homeschooling babysitting
    tasting sightseeing snorkelling snorkeling diving rowing kayaking canoeing sledging
    sledding weightlifting lifting bodybuilding crafting scrapbooking quilting gaming
    streaming blogging vlogging podcasting birdwatching stargazing decorating proofreading
    editing publishing spending wellbeing bedding hearing driving planning riding composting
    welding hiring cleaning screening testing booking""")
_ED_NOUNS = _words("bed red shed seed speed feed weed breed sled need hundred sacred")

_ADVERBS = _words(
    """actually again ago almost alone already also although always anyway anyways anymore
    apparently around away back basically certainly clearly completely constantly currently
    definitely either else enough especially even eventually ever every exactly extremely
    fairly far finally first forever fortunately hardly here honestly hopefully however indeed
    instead just kinda lately later least less likely literally luckily maybe meanwhile merely
    mostly much nearly never nonetheless normally obviously often once otherwise perhaps pretty
    probably quickly quite rarely rather really recently seriously simply slightly sometimes
    somewhat somewhere soon still super surely thankfully there though thus today together
    tomorrow tonight totally truly unfortunately usually whatever whenever wherever yesterday
    yet absolutely anywhere everywhere nowhere elsewhere ahead along aside forward onto upon
    within without towards toward across behind beside besides beyond throughout via since
    unless whether till per regarding despite among amongst except sorta lots tons plenty
    earlier later sooner overall else instead almost awhile anyhow somehow underneath beneath
    inside outside nearby upstairs downstairs overseas abroad alongside meantime near past
    worth ish sometime"""
)
_PRONOUNS = _words(
    """anybody anyone anything everybody everyone everything nobody none nothing somebody
    someone something another us whose whoever whichever whatever stuff thing things
    ya y'all yall u ur yours mine thee thou each every either neither ones others other's"""
)
# Pleasantries, reactions, evaluative adjectives and chat filler (with the contractions chat
# writes without an apostrophe): never a title, and never inside one.
_FILLER = _words(
    """thanks thank thankyou thx ty please pls plz welcome sorry congrats congratulations
    cheers bye goodbye goodnight hey hi hello hiya howdy yo sup great good nice cool awesome
    amazing wonderful fantastic fabulous terrific excellent brilliant lovely beautiful perfect
    incredible impressive interesting exciting excited glad happy sad proud fun funny sure
    fine okay ok alright right wow whoa yay yeah yep yup yes nope nah no lol lmao rofl haha
    hahaha hehe hmm hm um umm uh ah ahh aw aww oh ooh omg btw idk tbh imo imho fyi ugh meh oops
    kind sort lot bit tad dear buddy pal mate guys guy folks man dude sir madam yea ya
    absolutely definitely totally indeed true false agree agreed exactly cute sweet neat
    best better worse worst bad terrible awful horrible luck favorite favourite etc whatnot
    gorgeous stunning inspiring inspired motivated motivating rewarding fulfilling
    heartbreaking heartwarming touching uplifting relaxing calming soothing refreshing
    challenging frustrating annoying boring confusing disappointing encouraging fascinating
    overwhelming surprising terrifying satisfying thrilling promising comforting amusing
    charming embarrassing exhausting entertaining welcoming worried nervous scared afraid
    anxious tired ready able difficult possible impossible lonely grateful thankful blessed
    jealous angry mad crazy weird strange awkward stressful stressed overwhelmed interested
    fascinated surprised shocked disappointed frustrated confused bored curious honest brave
    strong positive negative lucky unlucky tough upset cheerful joyful delighted pleased passionate
    thrilled stoked psyched pumped bummed sucks wicked epic legit dope sick incredible
    unbelievable insane huge massive gonna wanna gotta lemme gimme dunno cuz coz bc tho thru
    im ive id youre theyre dont doesnt didnt cant wont isnt arent wasnt werent thats whats
    hows wheres whos lets hes shes theres couldnt wouldnt shouldnt havent hasnt hadnt aint
    yum yummy yikes geez gosh jeez huh hah heh ha welp whew phew woo woohoo hooray ew eww
    mmm mm lmk brb ttyl np nvm ikr smh ppl xoxo xd hahah hehehe definately alot
    teh abt ngl smth sth shld wat wot tmrw tmr tmw rly prob probs"""
)
_NUMBER_WORDS = _words(
    """zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
    fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty
    ninety hundred hundreds thousand thousands million millions billion dozen dozens couple
    first third fourth fifth sixth seventh eighth ninth tenth twelfth once twice triple
    several few many most more lots"""
)
# Units of measure and money: what a number counts, never the subject.
_UNITS = _words(
    """percent cent cents pound pounds quid buck bucks dollar dollars euro euros yen grand
    gram grams kilo kilos kg km kms mile miles metre metres meter meters cm mm inch inches
    litre litres liter liters ml mph kph lbs oz ounce ounces degrees celsius fahrenheit""")
# Spans of time a number can count, and the words that follow such a measure ("4 year old",
# "3 minutes max", "2 weeks later"): part of the measure, not of a phrase (see ``_runs``).
_SPANS = _words("""second seconds minute minutes min mins hour hours hr hrs day days night nights
    week weeks month months year years yr yrs decade decades century centuries page pages
    line lines word words step steps time times""")
_AFTER_MEASURE = _words("old max maximum min minimum tops ago later earlier long away each apart ish")
# Nouns that only ever make bad phrases ("full time piano teacher", "working on it").
_NEVER = _words("time times working")
_QUESTION = _words("what when where which who whom whose why how what's how's")
_STOP = (STOPWORDS | _VERB_FORMS | _ADVERBS | _PRONOUNS | _FILLER | _NUMBER_WORDS | _QUESTION
         | _UNITS | _NEVER
         | _words("mr mrs ms dr st vs versus etc ie eg via let's shall may might must ought next last "
                  "this til till until")
         # Vague qualifiers: no title starts "Different money question" or "Particular date".
         | _words("different particular certain various same other similar specific entire own "
                  "further usual previous typical")) - _NOT_VERBS - _ING_NOUNS

# Generic nouns and calendar words: fine inside a phrase ("weekend trip", "Sunday brunch"),
# never a title on their own, and they lend a phrase little weight.
_WEAK = _words(
    """day days week weeks weekend weekends month months year years today moment
    moments while morning mornings evening evenings night nights afternoon hour hours minute
    minutes second seconds way ways people person part parts place places idea ideas question
    questions answer answers reason reasons point points fact facts case cases example examples
    sense side sides end rest word words name names type types kind kinds sort sorts bit lot
    lots number numbers world everyone everything anything nothing something experience
    experiences situation situations thought thoughts feeling feelings chance chances option
    options step steps issue issues problem problems matter stuff detail details level levels
    area areas version start beginning future past present update updates goal goals tip tips
    advice help info information change changes piece pieces list lists today tonight tomorrow
    yesterday january february march april june july august september october november
    december monday tuesday wednesday thursday friday saturday sunday difference support care
    photo photos pic pics picture pictures video videos vid vids image images selfie pm am
    memory memories talk chat conversation message messages visit play lots stories story
    topic topics subject subjects
    color colour colors colours deal life group groups self nature"""
)
# What people feel and wish each other in chit-chat: a LoCoMo theme whose children shared
# only "so grateful" and "what a joy" was titled "Gratitude" or "Joy" (docs/titles.md).
_WEAK |= _words(
    """joy joys gratitude encouragement inspiration happiness excitement appreciation passion
    passions motivation positivity pride kindness courage success successes dream dreams
    friend friends"""
)
# Words that only modify: they start or sit inside a phrase ("new job", "half marathon",
# "red tractor") but never end one or stand alone; adjectives ending "-ful", "-ous", "-less",
# "-ive", "-able" and "-ible" are treated alike (nouns among them listed in _SUFFIX_NOUNS).
_MODIFIERS = _words(
    """new old big small little long short high low young full free real whole different
    important special main entire same other own certain recent previous early late tiny
    large latest current usual common general basic simple quick easy hard busy daily weekly
    monthly yearly half double single healthy local public private personal social national
    international professional second red blue green yellow black white orange purple pink
    brown grey gray dark light bright deep extra total complete final further various whole
    typical regular normal major minor serious mid soft warm cold hot wet dry heavy thin
    thick fresh clean dirty quiet loud rich poor safe cheap expensive fast slow strong weak
    tall wide narrow round sharp smooth rough loose tight raw ripe sweet sour bitter
    spicy salty plain fancy empty ready rare proper decent dead alive asleep awake close
    resilient pregnant intense eager organic""")
_ADJ_SUFFIXES = ("ful", "ous", "less", "able", "ible")  # evaluative: stop words
_MOD_SUFFIXES = ("ive", "istic", "ical")  # classifying ("creative writing"): modifiers
_SUFFIX_NOUNS = _words(
    """executive executives detective detectives relative relatives initiative objective
    alternative perspective incentive archive archives olive olives motive vegetable
    vegetables timetable variable variables constable syllable turntable collectible
    collectibles convertible representative representatives explosive explosives
    narrative sedative adhesive handful spoonful mouthful musical musicals chemical
    chemicals""")
_BE = _words(
    """am is are was were be been being 'm 're i'm you're we're they're he's she's it's that's
    there's i've we've you've they've im youre theyre thats keep keeps kept stop stopped
    finish been also just still really""")
_DETERMINERS = _words(
    """a an the my your his her its our their this that these those some any me you him us them
    it myself yourself himself herself ourselves themselves every each no""")
# Words after which a word is a verb ("we ride horses", "I'd paint", "can't run").
_VERB_CONTEXT = _words(
    """i you we they he she i'll you'll we'll they'll he'll she'll i'd you'd we'd they'd he'd
    she'd can could will would should must might may shall can't couldn't won't wouldn't
    shouldn't don't doesn't didn't cannot dont doesnt didnt cant wont gonna wanna gotta let's
    lets usually often always sometimes never also just still even rarely""")
# Words before a name that make it a form of address ("Thanks, Gina!", "Hey Mel,").
_ADDRESS = _words("hey hi hello thanks thank wow yeah yes sorry congrats cheers bye dear "
                  "oh ok okay sure welcome hiya morning evening night")
_APOSTROPHE = "’"


_LAUGH = re.compile(r"(?:[hj][aeiou]){2,}h?|(?:lo)+l")  # "hahaha", "lolol"
_ELONGATED = re.compile(r"(.)\1\1")  # "sooo", "yesss", "hmmm"
# "-ing" words never used as verbs; other "-ing" words are verbs after a form of "be" or
# before a determiner ("we're planning", "painting the fence").
_ING_ALWAYS_NOUNS = _words(
    """thing things something nothing anything everything morning evening spring string king
    ring wing sibling ceiling pudding wedding darling duckling dumpling earring earrings
    offspring stocking icing lightning ping""")

STOP, CONTENT, ED, MOD, WEAK = range(5)  # word kinds (module-private; names for readability)


_KINDS: dict[str, int] = {}


def _kind(low: str) -> int:
    """How a lower-case word takes part in phrases (cached: words are Zipfian)."""
    kind = _KINDS.get(low)
    if kind is None:
        if len(_KINDS) > 50_000:
            _KINDS.clear()
        kind = _KINDS[low] = _classify(low)
    return kind


def _classify(low: str) -> int:
    if any(ch.isdigit() for ch in low):
        return STOP
    base = low[:-2] if low.endswith("'s") else low
    if "'" in base or base in _STOP or low in _STOP or _LAUGH.fullmatch(base) \
            or _ELONGATED.search(base):
        return STOP
    if len(base) < 3 or len(base) > 24 and base.isascii():
        # Two-letter acronyms ("AI", "TV") are let in by their surface form; very long ASCII
        # tokens are identifiers, hashes or glued words, not names of subjects.
        return STOP
    # A time or a quality owns no subject: "next year's Birken", "my 11-year-old's lunchbox
    # note" (its digits cut, "old's" starts the run) must not title "Year's Birken", "Old's
    # lunchbox note".
    owner = base != low
    if base in _WEAK:
        return STOP if owner else WEAK
    suffixed = len(base) >= 6 and base not in _SUFFIX_NOUNS
    if suffixed and base.endswith(_ADJ_SUFFIXES) or _graded(base):
        return STOP
    if base in _MODIFIERS or suffixed and base.endswith(_MOD_SUFFIXES):
        return STOP if owner else MOD
    if base.endswith("ed") and len(base) >= 5 and base not in _ED_NOUNS \
            and not base.endswith("eed"):
        return ED
    if _is_adverb(base):
        return STOP
    return CONTENT


_GRADABLE = _words("fast slow cheap near close strong weak warm cold hot cool wide tall nice "
                   "happy easy busy early heavy pretty funny crazy silly tasty healthy dirty "
                   "quick safe fine rich poor bright smart great good")


def _graded(w: str) -> bool:
    """A comparative or superlative of a modifier ("longer", "biggest", "easiest")."""
    for suffix in ("est", "er"):
        if not w.endswith(suffix) or len(w) < len(suffix) + 3:
            continue
        stem = w[: -len(suffix)]
        for cand in (stem, stem + "e", stem[:-1] if stem[-1:] == stem[-2:-1] else "",
                     stem[:-1] + "y" if stem.endswith("i") else ""):
            if cand and (cand in _MODIFIERS or cand in _GRADABLE):
                return True
    return False


# Nouns ending "-ly" (other "-ly" words are adverbs or adjectives: "properly", "friendly").
_LY_NOUNS = _words(
    """family italy july rally belly jelly ally supply reply assembly lily emily holly bully
    butterfly dragonfly firefly anomaly monopoly sally kelly molly polly billy willy jolly
    fly gully tally folly dolly trolley""")


def _is_adverb(w: str) -> bool:
    return len(w) >= 5 and w.endswith("ly") and w not in _LY_NOUNS


def _unlabel(m: re.Match[str]) -> str:
    label = m.group(0)
    return "\n" if all(w[:1].isupper() for w in label.strip()[:-1].split()) else label


_WORDS_SEEN: dict[str, tuple[str, str, int]] = {}


def _word(word: str) -> tuple[str, str, int]:
    """(surface, lower case, kind) of a word as the tokenizer found it (cached: words are
    Zipfian, and these steps were a third of what tokenizing an exchange cost)."""
    got = _WORDS_SEEN.get(word)
    if got is None:
        if len(_WORDS_SEEN) > 50_000:
            _WORDS_SEEN.clear()
        surface = word.replace(_APOSTROPHE, "'")
        low = surface.lower()
        kind = _kind(low)
        if len(low) == 2 and surface.isupper() and surface.isalpha() and low not in _STOP:
            kind = CONTENT  # an acronym ("AI", "TV"; not "4K"); lower-case two-letter words never count
        got = _WORDS_SEEN[word] = (surface, low, kind)
    return got


class _Toks:
    """A text's tokens as parallel lists (lower case, surface, sentence-initial, kind): the
    phrase counter reads them by index, so no object is made per token. Punctuation is a
    token of kind STOP with an empty lower case."""

    __slots__ = ("low", "surface", "initial", "kind", "joined")

    def __init__(self) -> None:
        self.low: list[str] = []
        self.surface: list[str] = []
        self.initial: list[bool] = []
        self.kind: list[int] = []
        # indexes of words joined to the word before by a hyphen ("second-hand": "hand")
        self.joined: set[int] = set()


def _tokens(text: str) -> _Toks:
    # Each rewrite runs only when its pattern can match (a URL or address needs "://", "www."
    # or "@", a speaker label a colon, a joined word a hyphen): most texts hold none, and
    # the scans cost a fifth of the tokenizing.
    if "@" in text or "://" in text or "www." in text.lower():
        text = _URL.sub(" . ", text)
    if ":" in text:
        text = _LABEL.sub(_unlabel, text)
    toks = _Toks()
    joins: list[int] = []
    if "-" in text or "\u2010" in text:
        joins = [m.end() for m in _HYPHEN.finditer(text)]
        text = _HYPHEN.sub(" ", text)
    lows, surfaces, initials, kinds = toks.low, toks.surface, toks.initial, toks.kind
    if joins:
        # token index of each word starting right after a hyphen (the rare path: the offsets
        # need a second scan)
        at = {m.start(): n for n, m in enumerate(_TOKEN.finditer(text))}
        toks.joined = {at[j] for j in joins if j in at}
    initial = True
    for word, end, punct in _TOKEN.findall(text):
        if not word:
            if end:
                initial = True
            lows.append("")
            surfaces.append(end or punct)
            initials.append(initial)
            kinds.append(STOP)
            continue
        surface, low, kind = _word(word)
        lows.append(low)
        surfaces.append(surface)
        initials.append(initial)
        kinds.append(kind)
        initial = False
    return toks


def _address(toks: _Toks, start: int, end: int) -> bool:
    """A name used to address someone ("Thanks, Gina!", "Hey Mel, ..."): not a subject."""
    surfaces = toks.surface
    if end - start > 2 or not all(s[:1].isupper() for s in surfaces[start:end]):
        return False
    if end < len(surfaces) and surfaces[end] not in (",", "!", "?", ".", "!!", "?!", "...", "…"):
        return False
    return start > 0 and (surfaces[start - 1] == "," or toks.low[start - 1] in _ADDRESS)


def _runs(toks: _Toks) -> list[tuple[int, int]]:
    """The runs of candidate words, as (start, end) token index ranges."""
    runs: list[tuple[int, int]] = []
    start = 0
    lows, kinds = toks.low, toks.kind

    def close(end: int) -> None:
        if end > start and not _address(toks, start, end):
            runs.append((start, end))

    last = len(lows) - 1
    prev = ""
    measure = False  # the word before belongs to a measure ("3 minutes", "4 year old")
    for i, w in enumerate(lows):
        # _verbal and _participle written out: they ran for every token of every exchange.
        kind = kinds[i]
        ing = len(w) >= 5 and w.endswith("ing") and w not in _ING_ALWAYS_NOUNS
        # What a number measures, and the word that qualifies the measure, are no subject:
        # "a 4 year old girl", "3 minutes max", "two weeks later" (not "year old girl" or
        # "minutes max").
        measure = (w in _SPANS and (prev in _NUMBER_WORDS or prev[:1].isdigit())) or (
            measure and w in _AFTER_MEASURE)
        if kind == STOP or measure or prev in _VERB_CONTEXT or ing and (
                prev in _BE or (lows[i + 1] if i < last else "") in _DETERMINERS):
            close(i)
            start = i + 1
        elif kind == ED and i > start:
            close(i)
            start = i
        elif i > start and ing and w not in _ING_NOUNS:
            # A noun then an "-ing" word is a clause ("a bird flying over"), not a compound
            # ("dog walking", "marathon training": those "-ing" words are listed nouns).
            close(i)
            start = i + 1
        prev = w
    close(len(lows))
    return runs


def _base(word: str) -> str:
    return word[:-2] if word.endswith("'s") else word


def phrase_counts(text: str) -> dict[str, int]:
    """Candidate title phrases of one text (one exchange), with case hints.

    Keys: 1-3 lower-case content words joined by spaces ("kitchen renovation budget",
    "half marathon", "maya's birthday party": a possessive may start a phrase, and is
    stripped when it would end one); never a word with a digit, a stop word, a verb form the
    lists know, a pleasantry or filler, or a word of one or two letters (upper-case
    two-letter acronyms excepted). Values: occurrences, capped at ``PER_TEXT_CAP`` per text.
    Keys with an upper-case letter are case hints (see the module docstring).
    """
    toks = _tokens(text)
    lows, surfaces, initials, kinds, joined = toks.low, toks.surface, toks.initial, toks.kind, toks.joined
    counts: dict[str, int] = {}
    get = counts.get
    caps: tuple[bool, set[str]] | None = None  # read on the first word in capitals
    for first, stop in _runs(toks):
        # Every window of 1-MAX_WORDS words of the run, tested over the token lists: a window
        # is counted unless it ends on an "-ed" word or a modifier, a word after its first is
        # a possessive (then every longer window from that start fails too), or it holds no
        # content word; one word counts only as a content word, its "'s" stripped. Nor does
        # a window of several words start or end inside a hyphenated word of the run
        # ("second-hand Yamaha" gives "second hand yamaha", never "hand yamaha"); its single
        # words still count, as words (``_Pool.cohesion`` reads them).
        for i in range(first, stop):
            inside = i in joined and i > first
            content = False
            for j in range(i, min(stop, i + MAX_WORDS)):
                kind = kinds[j]
                if kind == CONTENT:
                    content = True
                if j > i and (inside or lows[j].endswith("'s")):
                    break
                if kind == ED or kind == MOD or not content or j > i and j + 1 in joined and j + 1 < stop:
                    continue
                key = _base(lows[i]) if j == i else " ".join(lows[i : j + 1])
                counts[key] = min(PER_TEXT_CAP, get(key, 0) + 1)
        for i in range(first, stop):
            surface = surfaces[i]
            if surface == lows[i]:  # no capital: not a case hint
                continue
            s = _base(surface)
            if s != s.lower() and (not initials[i] or s.isupper() or s[1:] != s[1:].lower()):
                if s.isupper():  # an acronym, unless the text shouts or stresses it
                    if caps is None:
                        caps = _caps_context(surfaces)
                    if caps[0] or s.lower() in caps[1]:
                        continue
                counts[s] = min(PER_TEXT_CAP, get(s, 0) + 1)
    return counts


def _caps_context(surfaces: list[str]) -> tuple[bool, set[str]]:
    """Whether a text shouts (two words of three letters or more in capitals, and most of
    them: "I NEED TAX HELP" must not title a topic "TAX", nor "PUMASA SI PAOLO!!!" one
    "PUMASA SI paolo"; ``_Pool.render`` takes an acronym at
    a quarter of a word's uses), and the words it writes capitalised, in lower case (one it
    also writes in capitals is emphasis: "superB REAM" beside "Ream of paper"; a lower-case
    form does not count, as it may be a web address: "nzsl.nz" beside "NZSL")."""
    words = [w for w in surfaces if len(w) >= 3 and w.isalpha()]
    caps = sum(w.isupper() for w in words)
    return caps >= 2 and 2 * caps > len(words), {w.lower() for w in surfaces if w[:1].isupper() and not w.isupper()}


USER_WEIGHT = 2


def exchange_phrase_counts(user_text: str, assistant_text: str = "") -> dict[str, int]:
    """``phrase_counts`` of one exchange, the user's words counting ``USER_WEIGHT`` times.

    People name their subject in their own words ("I signed up for a half marathon"); an
    assistant's longer answers add the generic vocabulary around it ("race", "pace"). Only
    the sum is kept, so the counter stays one mergeable ``dict``.
    """
    out = phrase_counts(assistant_text) if assistant_text else {}
    for k, c in phrase_counts(user_text).items():
        out[k] = out.get(k, 0) + USER_WEIGHT * c
    return out


def is_phrase(key: str) -> bool:
    """True for a phrase key, False for a case hint."""
    return key == key.lower()


def phrase_words(counts: Mapping[str, int]) -> set[str]:
    """The words whose document frequency titling ``counts`` needs, as ``text.terms`` spells
    them (lower case, "'s" stripped): fetch these from the store's term statistics."""
    return {_base(w) for k in counts if is_phrase(k) for w in k.split()}


def merge_phrases(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    """The sum of two phrase counters (a node's counter plus one more text's, or a child's)."""
    out = dict(a)
    for k, c in b.items():
        out[k] = out.get(k, 0) + c
    return out


def subtract_phrases(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    """``a`` less ``b`` (an exchange leaving a node), dropping entries that reach zero."""
    return {k: c - b.get(k, 0) for k, c in a.items() if c - b.get(k, 0) > 0}


def prune_phrases(counts: Mapping[str, int], keep: int) -> dict[str, int]:
    """Keep the ``keep`` strongest entries of a phrase counter (bounded per-node statistics).

    By count, then longer phrases first (their words are counted again in the shorter keys),
    then alphabetically for determinism. Case hints compete like any entry.
    """
    if len(counts) <= keep:
        return dict(counts)
    ranked = sorted(counts)  # stable sorts, last key first (text.prune_counts)
    ranked.sort(key=_spaces, reverse=True)
    ranked.sort(key=counts.__getitem__, reverse=True)
    return {k: counts[k] for k in ranked[:keep]}


_spaces = methodcaller("count", " ")


DF = Callable[[str], int] | Mapping[str, int]


def _df_lookup(df: DF) -> Callable[[str], int]:
    if callable(df):
        return df
    table = df
    return lambda w: table.get(w, 0)


def _singular(word: str) -> str:
    """A crude English singular, used only to pool "greyhound" with "greyhounds"."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("sses", "ches", "shes", "xes", "zes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is", "'s")):
        return word[:-1]
    return word


def title_key(title: str) -> str:
    """What two titles a reader takes for the same are equal under: case, possessives and
    plurals aside ("Dreams" and "Dream", "Leo's mum" and "Leo mum")."""
    words = title.lower().replace("\u2019", "'").replace("'s ", " ").removesuffix("'s").split()
    return " ".join(_singular(w) for w in words)


def repeats(title: str, of: str) -> bool:
    """Whether ``title`` says nothing ``of`` does not: all its words are ``of``'s, as
    ``title_key`` spells them ("Hearing" and "Hearing aids"; "Aids for hearing" is not)."""
    words = title_key(title).split()
    return bool(words) and set(words) <= set(title_key(of).split())


def says_more(avoid: Collection[str], within: Collection[str]) -> Callable[[str], bool]:
    """A test of a candidate title: not one of ``avoid`` (as ``title_key`` spells titles), nor
    made only of the words of one of ``within`` (``repeats``): what ``make_title`` keeps, and
    what a theme's title must pass under the theme above it (``TreeSession._title``)."""
    said = {title_key(a) for a in avoid}
    return lambda title: title_key(title) not in said and not any(repeats(title, w) for w in within)


@functools.lru_cache(maxsize=65_536)
def _pool_key(key: str) -> str:
    head, _, last = key.rpartition(" ")
    return f"{head} {_singular(last)}" if head else _singular(last)


class _Pool:
    """Phrase counts with plural variants pooled ("dog" + "dogs"), each shown as its most
    frequent variant, and case hints kept aside for rendering."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.count: dict[str, int] = {}
        self.shown: dict[str, tuple[int, str]] = {}
        self.hints: dict[str, tuple[int, str]] = {}
        # word_count per word (cohesion and the scorer ask it for every word of every phrase)
        self._word_counts: dict[str, int] = {}
        for key, c in counts.items():
            if c <= 0:
                continue
            if key != key.lower():
                low = key.lower()
                if low not in self.hints or (c, key) > self.hints[low]:
                    self.hints[low] = (c, key)
                continue
            pooled = _pool_key(key)
            self.count[pooled] = self.count.get(pooled, 0) + c
            # The most frequent variant; on a tie the singular (shorter) one.
            if pooled not in self.shown or (c, -len(key)) > (self.shown[pooled][0],
                                                             -len(self.shown[pooled][1])):
                self.shown[pooled] = (c, key)

    def word_count(self, word: str) -> int:
        got = self._word_counts.get(word)
        if got is None:
            got = self._word_counts[word] = self.count.get(_singular(_base(word)), 0)
        return got

    def cohesion(self, key: str, count: int) -> float:
        """How much a multi-word phrase is a fixed expression rather than words that met
        once: the share of its rarest word's repeat occurrences that fall inside it (0 for a
        phrase seen once, 1 for "half marathon" when "marathon" never comes alone)."""
        if " " not in key or count < 2:
            return 0.0
        inner = [self.word_count(w) for w in key.split()]
        least = min((c for c in inner if c > 0), default=count)
        return min(1.0, (count - 1) / max(1, least - 1))

    def render(self, pooled: str) -> str:
        words = []
        for w in self.shown[pooled][1].split():
            base = _base(w)
            hint = self.hints.get(base)
            # A capitalised form wins when it is at least half of the word's uses; an acronym
            # ("NZSL", written so by the assistant while the user types "nzsl") at a quarter.
            if hint is not None and (4 if _acronym(hint[1]) else 2) * hint[0] >= self.word_count(base):
                base = hint[1]
            words.append(base + w[len(_base(w)):])
        text = " ".join(words)
        if len(text) > MAX_TITLE_CHARS:
            # Only a script written without spaces gets here (a whole clause is one "word").
            text = text[: MAX_TITLE_CHARS - 1].rstrip() + "…"
        return text[:1].upper() + text[1:]


def _acronym(word: str) -> bool:
    return len(word) >= 2 and word.isalpha() and word.isupper()


_LENGTH_BONUS = (0.0, 1.0, 1.25, 1.4)
_IDF_HALF = 1.5
_PSEUDO_DOCS = 20


class _Scorer:
    def __init__(self, df: DF, n_docs: int, inside: _Pool | None = None, members: int = 0) -> None:
        self._df = _df_lookup(df)
        self._n = max(1, n_docs)
        self._idf: dict[str, float] = {}
        # A theme's words are weighed by how rare they are *outside* it (c-TF-IDF's idea): its
        # subject word ("party" in a third of a small memory's texts) is common because the
        # theme is big, and the plain idf condemned it in favour of one child's phrase.
        self._inside = inside
        self._members = max(0, members)
        # Each word's weight in ``specificity`` (a word recurs across a node's phrases).
        self._weights: dict[str, float] = {}

    def word_idf(self, word: str) -> float:
        """How much a word can name a subject, in (0, 1): the user's idf of the word squashed
        so that a word in a third of the user's texts ("photo", a name) weighs little while a
        recurring subject ("pottery" in a tenth of them) weighs nearly as much as a one-off
        word. ``_PSEUDO_DOCS`` unseen texts keep a small memory's idf from condemning its
        main subject."""
        w = _base(word)
        v = self._idf.get(w)
        if v is None:
            if self._inside is not None:
                outside = self._df(w) - min(self._inside.word_count(w), self._members)
                raw = idf(max(1, outside), max(1, self._n - self._members) + _PSEUDO_DOCS)
            else:
                raw = idf(max(1, self._df(w)), self._n + _PSEUDO_DOCS)
            v = self._idf[w] = raw * raw / (raw * raw + _IDF_HALF * _IDF_HALF)
        return v

    def specificity(self, key: str) -> float:
        """Mean weight of the phrase's words (generic words count little), times a bonus for
        length."""
        words = key.split()
        known = self._weights
        weights = [known[w] if w in known else self._weight(w) for w in words]
        return sum(weights) / len(words) * _LENGTH_BONUS[min(len(words), MAX_WORDS)]

    def _weight(self, word: str) -> float:
        v = self._weights[word] = self.word_idf(word) * (0.4 if _kind(word) == WEAK else 1.0)
        return v

    def rank(self, pool: _Pool, frequency: Callable[[str, int], float],
             keys: Iterable[str] | None = None) -> list[tuple[float, str]]:
        """``pool``'s phrases (or only ``keys``) by score, best first; ties alphabetical."""
        scored = []
        for key in pool.count if keys is None else keys:
            count = pool.count[key]
            score = frequency(key, count) * self.specificity(key) \
                * (1.0 + pool.cohesion(key, count))
            scored.append((score, key))
        scored.sort(key=lambda p: (-p[0], p[1]))
        return scored


def make_title(phrases: Mapping[str, int], df: DF, n_docs: int, *, members: int = 1,
               avoid: Collection[str] = (), within: Collection[str] = (),
               closeness: Closeness | None = None, opening: Collection[str] = ()) -> str:
    """The title of a node from its phrase counter (``phrase_counts`` summed over its texts).

    ``df`` gives the user's document frequency of a word (``text.terms`` spelling; a mapping
    or a function; unknown words count as rare) and ``n_docs`` the number of documents it is
    counted over; ``members`` is how many texts the counter sums. The best phrase by
    frequency (sub-linear, and relative to ``members``) times the mean squashed idf of its
    words, favouring phrases that recur as a whole, capitalised ("Kitchen renovation
    budget"); at most ``MAX_TITLE_CHARS`` characters. ``"Untitled"`` only when the counter
    holds no phrase (texts of nothing but pleasantries, numbers and function words).
    ``avoid``: titles not to give (a topic: its theme's; a theme: its children's, as
    "Learning Japanese" > "Learning Japanese" tells a reader nothing), unless the node has no
    other phrase. ``within``: titles whose words alone a title must not be made of either (a
    topic's theme: "Hearing" under "Hearing aids" says nothing of what sets the topic apart),
    with the same exception. ``closeness`` and ``opening``: see ``theme_title``; without
    ``closeness``, ``opening`` boosts the candidates it names (``_TOPIC_OPENING_BOOST``).
    """
    pool = _Pool(phrases)
    ranked = _Scorer(df, n_docs).rank(pool, _node_frequency(members))
    if not ranked:
        return UNTITLED
    if opening and closeness is None:
        # Without closeness (a topic standing alone at the top level), the words the node's
        # first message names count ``_TOPIC_OPENING_BOOST`` times: "Knee", not "Single leg".
        ranked = sorted(((score * (1.0 + (_TOPIC_OPENING_BOOST - 1.0) * _named(key, opening)), key)
                         for score, key in ranked), key=lambda p: (-p[0], p[1]))
    if avoid or within:
        # Only the first _PICK_DEPTH phrases left matter to _pick: render no more than that
        # (a topic under a theme is titled this way on every exchange while it is small).
        fresh = says_more(avoid, within)
        other = list(itertools.islice((r for r in ranked if fresh(pool.render(r[1]))), _PICK_DEPTH))
        ranked = other or ranked
    return _choose(pool, ranked, _TOPIC_EXTEND, closeness, named=opening)


def _node_frequency(members: int) -> Callable[[str, int], float]:
    """How a node's phrase counts weigh (``make_title``): sub-linear, and relative to the
    ``members`` texts the counter sums."""
    m = max(1, members)

    def frequency(_key: str, count: int) -> float:
        return (1.0 + math.log(count)) * (1.0 + min(1.0, count / m))

    return frequency


#: A longer phrase holding the best phrase wins at this share of its score: in a topic, and
#: in a theme (whose longer phrase is shared by two children already).
_TOPIC_EXTEND = 0.8
_THEME_EXTEND = 0.6

#: How many of the best-ranked phrases ``_pick`` looks at.
_PICK_DEPTH = 8


#: With ``closeness``, a candidate's score counts with this power beside its closeness to the
#: node: the nearest of the best few wins unless it scored far below them (docs/titles.md,
#: "Nearest phrase"; 0 would ignore the counts, 1 weigh them as much as the closeness).
_NEAR_SCORE = 0.25

#: Cosines of rendered candidate titles to the node (``title_vectors.PhraseVectors``), or None
#: when they cannot be had (the offline pick stands).
Closeness = Callable[[Sequence[str]], Sequence[float] | None]


#: With ``closeness``, a theme's candidate whose words its opening message holds counts its
#: closeness this many times (a share of its words: a share of the boost). 2 to 3 all named
#: the subject about as often on the development histories; docs/titles.md, "The opening
#: message".
_OPENING_BOOST = 2.5

#: Without closeness, the factor on the score of a candidate whose words the node's opening
#: message holds (a share of its words: a share of the boost); ``make_title`` for a topic
#: alone at the top level (docs/titles.md, "A topic's opening message"). 1.5 and 2.5 named the
#: subject about as often on the subject histories (179 / 178 of 366 top-level titles, 174
#: without); 1.5 changed fewer titles.
_TOPIC_OPENING_BOOST = 1.5

#: How many two-word phrases of a theme's opening message join its candidates
#: (``_theme_words``).
_OPENING_PHRASES = 4


def opening_words(text: str) -> frozenset[str]:
    """The words of a message as ``_choose`` compares them with a candidate's (lower case,
    possessive and plural off): the theme's opening message (``theme_title``)."""
    return frozenset(_singular(_base(w)) for w in _tokens(text).low if w)


def _named(key: str, named: Collection[str]) -> float:
    """The share of a candidate's words that ``named`` holds."""
    words = key.split()
    return sum(_singular(_base(w)) in named for w in words) / len(words)


def _choose(pool: _Pool, ranked: list[tuple[float, str]], extend: float,
            closeness: Closeness | None, words: Sequence[tuple[float, str]] = (),
            named: Collection[str] = ()) -> str:
    """The title among ``ranked``: the offline pick (``_pick``), or with ``closeness`` the one
    of the best ``_PICK_DEPTH`` whose score (to the power ``_NEAR_SCORE``, relative to the
    best) times its cosine to the node is highest; the first on a tie. (A theme may so take
    a child's title, as the offline pick may; the child then takes its next phrase:
    ``TreeSession._unrepeat``. Keeping children's titles out instead let a child that took
    the subject's word push its theme onto a side word: "Beginners" over "Chord".)
    ``words``: more candidates, ranked on their own scale (a theme's single words, see
    ``theme_title``), that compete only by closeness: each counts its score relative to its
    own list's best. ``named``: the words of the theme's opening message (``opening_words``);
    a candidate among them is preferred (``_OPENING_BOOST``)."""
    top = ranked[:_PICK_DEPTH]
    if closeness is not None and (len(top) > 1 or words) and top and top[0][0] > 0:
        relative: dict[str, float] = {key: score / top[0][0] for score, key in top}
        more = words[:_PICK_DEPTH]
        if more and more[0][0] > 0:
            for score, key in more:
                relative[key] = max(relative.get(key, 0.0), score / more[0][0])
        keys = list(relative)
        texts = [pool.render(key) for key in keys]
        near = closeness(texts)
        if near is not None and len(near) == len(texts):
            value = [relative[k] ** _NEAR_SCORE * max(0.0, c)
                     * (1.0 + (_OPENING_BOOST - 1.0) * _named(k, named) if named else 1.0)
                     for k, c in zip(keys, near, strict=True)]
            return texts[value.index(max(value))]
    return pool.render(_pick(ranked, extend))


def _pick(ranked: list[tuple[float, str]], extend: float = _TOPIC_EXTEND) -> str:
    """The best-scored phrase, unless a longer phrase holding it is nearly as good (at least
    ``extend`` times its score)."""
    best = ranked[0][1]
    for score, key in ranked[1:_PICK_DEPTH]:
        if score >= extend * ranked[0][0] and f" {best} " in f" {key} " \
                and len(key) <= MAX_TITLE_CHARS:
            return key
    return best


def theme_title(children: Sequence[Mapping[str, int]], df: DF, n_docs: int, *,
                members: int | None = None, avoid: Collection[str] = (),
                closeness: Closeness | None = None, opening: Collection[str] = ()) -> str:
    """The title of a theme from its children's phrase counters: what they share.

    A phrase held by at least two children scores by the share of children holding it, its
    frequency and its specificity (as in ``make_title``); with no phrase shared by two
    children (or one child), ``make_title`` over all of them together, ``members`` (the
    exchanges under the theme; default the number of children) passed on, and ``avoid``
    (the children's titles: with nothing shared, the best phrase of all is usually one
    child's title, and the theme would wear its name). ``closeness``, when given, returns
    the cosines of candidate titles to the theme's centroid: the nearest of the best few
    then wins (``_choose``; organize/title_vectors.py). ``opening``, with ``closeness``: the
    words of the theme's first user message (``opening_words``), where a person names the
    subject they bring up ("I'm looking at a used ebike"), while the phrase nearest the
    centroid is often a detail the later visits keep returning to ("Battery"); a candidate
    it names is preferred (docs/titles.md, "The opening message").
    """
    kids = [c for c in children if c]
    if not kids:
        return UNTITLED
    total: dict[str, int] = {}
    for child in kids:
        for k, c in child.items():
            if c > 0:
                total[k] = total.get(k, 0) + c
    pool = _Pool(total)
    if len(kids) > 1:
        holders: dict[str, int] = {}
        for child in kids:
            for key in {_pool_key(k) for k, c in child.items() if c > 0 and is_phrase(k)}:
                holders[key] = holders.get(key, 0) + 1
        share = {k: h / len(kids) for k, h in holders.items() if h >= 2}
        if share:
            def frequency(key: str, count: int) -> float:
                return share[key] ** 2 * (1.0 + math.log(count))

            m = members or len(kids)
            scorer = _Scorer(df, n_docs, pool, m)
            ranked = scorer.rank(pool, frequency, share)
            # With closeness, the theme's own best words compete too, shared by its children
            # or not (docs/titles.md, "The subject's own word").
            words = _theme_words(pool, scorer, m, opening) if closeness is not None else []
            # A longer shared phrase wins at a lower bar than in a topic: a theme's best word
            # is often its subject's head noun, and the phrase round it says which ("Book
            # club", not "Book"; "Ping tool", not "Ping"), while a shared phrase already
            # recurs in two children.
            return _choose(pool, ranked, _THEME_EXTEND, closeness, words, opening)
    return make_title(total, df, n_docs, members=members or len(kids), avoid=avoid, closeness=closeness,
                      opening=opening)


def _theme_words(pool: _Pool, scorer: _Scorer, members: int,
                 opening: Collection[str] = ()) -> list[tuple[float, str]]:
    """More title candidates for a theme, ranked as ``make_title`` ranks a topic's phrases:
    its best ``_PICK_DEPTH`` single words, and the two-word phrases made of two of them
    ("Hip replacement" when both "hip" and "replacement" are among them).

    A subject is often named in one child only: "I bought a ukulele" opens the subject and
    the next topics talk of chords and songs, so the phrases the children share titled the
    theme "Songs". Single words alone brought in one-word halves ("Hip" for a hip
    replacement, "Book" for a book club); any two-word phrase brought in one child's side
    detail ("Centre wobbles" for pottery), which the two-best-words condition keeps out.

    ``opening`` (the words of the theme's first user message): two-word phrases it holds
    whole, with one of the best words in them, take the place of the weakest few (at most
    ``_OPENING_PHRASES``): "Fly fishing" where only "Fly" was a best word, "New York",
    "Half marathon" (docs/titles.md, "The opening message")."""
    frequency = _node_frequency(members)
    words = scorer.rank(pool, frequency, [k for k in pool.count if " " not in k])[:_PICK_DEPTH]
    best = {k for _, k in words}
    pairs = [k for k in pool.count if k.count(" ") == 1 and all(_pool_key(w) in best for w in k.split())]
    out = sorted(words + scorer.rank(pool, frequency, pairs), key=lambda p: (-p[0], p[1]))
    if opening:
        have = {k for _, k in out[:_PICK_DEPTH]}
        named = [k for k in pool.count if k.count(" ") == 1 and k not in have
                 and _named(k, opening) == 1.0 and any(_pool_key(w) in best for w in k.split())]
        more = scorer.rank(pool, frequency, named)[:_OPENING_PHRASES]
        out = sorted(out[:_PICK_DEPTH - len(more)] + more, key=lambda p: (-p[0], p[1]))
    return out
