"""Build the offline search corpus (docs.jsonl) from structured facts authored here.

Run: python trajectories/corpus/build_corpus.py   (rewrites trajectories/corpus/docs.jsonl)

Every document is {"id", "title", "url", "text"}: ``text`` is the full page that ``visit_page``
returns; search snippets are cut from it. The facts cover the sample questions
(trajectories/questions.jsonl) and the topics of the shipped sample trajectories, plus many
neighbouring entities so that search has plausible distractors.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (name, symbol, Z, year, discoverer(s), origin of the name)
ELEMENTS = [
    ("Hydrogen", "H", 1, "1766", "Henry Cavendish", "the Greek words hydro and genes, 'water-former'"),
    ("Helium", "He", 2, "1868", "Pierre Janssen and Norman Lockyer", "the Greek helios, the Sun"),
    ("Lithium", "Li", 3, "1817", "Johan August Arfwedson", "the Greek lithos, 'stone'"),
    ("Carbon", "C", 6, "antiquity", "unknown (known since antiquity)", "the Latin carbo, 'coal'"),
    ("Nitrogen", "N", 7, "1772", "Daniel Rutherford", "the Greek nitron and genes, 'nitre-former'"),
    ("Oxygen", "O", 8, "1774", "Carl Wilhelm Scheele and Joseph Priestley", "the Greek oxys and genes, 'acid-former'"),
    ("Sodium", "Na", 11, "1807", "Humphry Davy", "the English word soda; the symbol comes from the Latin natrium"),
    ("Magnesium", "Mg", 12, "1808", "Humphry Davy", "Magnesia, a district of Thessaly in Greece"),
    ("Chlorine", "Cl", 17, "1774", "Carl Wilhelm Scheele", "the Greek chloros, 'pale green'"),
    ("Scandium", "Sc", 21, "1879", "Lars Fredrik Nilson", "Scandia, the Latin name for Scandinavia"),
    ("Titanium", "Ti", 22, "1791", "William Gregor", "the Titans of Greek mythology"),
    ("Vanadium", "V", 23, "1830", "Nils Gabriel Sefström", "Vanadís, a name of the Norse goddess Freyja"),
    ("Cobalt", "Co", 27, "1735", "Georg Brandt", "the German Kobold, a goblin of the mines"),
    ("Nickel", "Ni", 28, "1751", "Axel Fredrik Cronstedt", "the German Kupfernickel, 'copper demon'"),
    ("Gallium", "Ga", 31, "1875", "Paul-Émile Lecoq de Boisbaudran", "Gallia, the Latin name for France"),
    ("Germanium", "Ge", 32, "1886", "Clemens Winkler", "Germania, the Latin name for Germany"),
    ("Selenium", "Se", 34, "1817", "Jöns Jacob Berzelius", "the Greek selene, the Moon"),
    ("Yttrium", "Y", 39, "1794", "Johan Gadolin", "the village of Ytterby near Stockholm"),
    ("Ruthenium", "Ru", 44, "1844", "Karl Ernst Claus", "Ruthenia, a Latin name for Russia"),
    ("Lanthanum", "La", 57, "1839", "Carl Gustaf Mosander", "the Greek lanthanein, 'to lie hidden'"),
    ("Cerium", "Ce", 58, "1803", "Jöns Jacob Berzelius and Wilhelm Hisinger", "the dwarf planet Ceres"),
    ("Samarium", "Sm", 62, "1879", "Paul-Émile Lecoq de Boisbaudran", "the mineral samarskite"),
    ("Europium", "Eu", 63, "1901", "Eugène-Anatole Demarçay", "the continent of Europe"),
    ("Gadolinium", "Gd", 64, "1880", "Jean Charles Galissard de Marignac", "the Finnish chemist Johan Gadolin"),
    ("Terbium", "Tb", 65, "1843", "Carl Gustaf Mosander", "the village of Ytterby in Sweden"),
    ("Dysprosium", "Dy", 66, "1886", "Paul-Émile Lecoq de Boisbaudran", "the Greek dysprositos, 'hard to get'"),
    ("Holmium", "Ho", 67, "1878", "Marc Delafontaine and Jacques-Louis Soret, and independently Per Teodor Cleve in 1879",
     "Holmia, the Latin name for Stockholm"),
    ("Erbium", "Er", 68, "1843", "Carl Gustaf Mosander", "the village of Ytterby in Sweden"),
    ("Thulium", "Tm", 69, "1879", "Per Teodor Cleve", "Thule, an ancient name for the far north and Scandinavia"),
    ("Ytterbium", "Yb", 70, "1878", "Jean Charles Galissard de Marignac", "the village of Ytterby in Sweden"),
    ("Lutetium", "Lu", 71, "1907", "Georges Urbain", "Lutetia, the Latin name for Paris"),
    ("Hafnium", "Hf", 72, "1923", "Dirk Coster and George de Hevesy", "Hafnia, the Latin name for Copenhagen"),
    ("Tantalum", "Ta", 73, "1802", "Anders Gustaf Ekeberg", "Tantalus of Greek mythology"),
    ("Tungsten", "W", 74, "1783", "Juan José and Fausto Elhuyar",
     "the Swedish tung sten, 'heavy stone'; the symbol W comes from wolfram"),
    ("Rhenium", "Re", 75, "1925", "Walter Noddack, Ida Tacke and Otto Berg", "Rhenus, the Latin name for the Rhine"),
    ("Polonium", "Po", 84, "1898", "Marie Curie and Pierre Curie", "Poland, Marie Curie's native country"),
    ("Francium", "Fr", 87, "1939", "Marguerite Perey", "France"),
    ("Radium", "Ra", 88, "1898", "Marie Curie and Pierre Curie", "the Latin radius, 'ray'"),
    ("Thorium", "Th", 90, "1829", "Jöns Jacob Berzelius", "Thor, the Norse god of thunder"),
    ("Americium", "Am", 95, "1944", "Glenn T. Seaborg and colleagues", "the Americas"),
    ("Berkelium", "Bk", 97, "1949", "Glenn T. Seaborg and colleagues", "the city of Berkeley, California"),
]

# (name, born-died, nationality, field, summary sentences)
PEOPLE = [
    ("Per Teodor Cleve", "1840-1905", "Swedish", "chemist and geologist",
     "Cleve was a professor at Uppsala University. In 1879 he separated two new oxides from erbia and named the "
     "elements holmium, after Holmia, the Latin name of his native Stockholm, and thulium, after Thule. He also "
     "studied diatoms. His daughter Astrid Cleve became the first woman in Sweden to earn a doctorate in science."),
    ("Astrid Cleve", "1875-1968", "Swedish", "botanist, chemist and geologist",
     "Astrid Cleve von Euler, daughter of the chemist Per Teodor Cleve, received her doctorate at Uppsala "
     "University in 1898 and was the first woman in Sweden to earn a doctorate in science. She married the chemist "
     "Hans von Euler-Chelpin in 1902; their son Ulf von Euler became a physiologist and Nobel laureate."),
    ("Ulf von Euler", "1905-1983", "Swedish", "physiologist and pharmacologist",
     "Ulf Svante von Euler, son of Hans von Euler-Chelpin and Astrid Cleve, worked at the Karolinska Institute in "
     "Stockholm. He identified noradrenaline as the transmitter of sympathetic nerves. He shared the 1970 Nobel "
     "Prize in Physiology or Medicine with Bernard Katz and Julius Axelrod for discoveries concerning the humoral "
     "transmitters in the nerve terminals."),
    ("Hans von Euler-Chelpin", "1873-1964", "German-born Swedish", "biochemist",
     "Hans von Euler-Chelpin shared the 1929 Nobel Prize in Chemistry with Arthur Harden for investigations on the "
     "fermentation of sugar and fermentative enzymes. He was married to Astrid Cleve, and their son Ulf von Euler "
     "received the Nobel Prize in Physiology or Medicine in 1970."),
    ("Bernard Katz", "1911-2003", "German-born British", "biophysicist",
     "Katz worked at University College London on the release of neurotransmitter at the neuromuscular junction. "
     "He shared the 1970 Nobel Prize in Physiology or Medicine with Ulf von Euler and Julius Axelrod."),
    ("Julius Axelrod", "1912-2004", "American", "biochemist",
     "Axelrod worked at the National Institutes of Health on the reuptake and metabolism of catecholamines. He "
     "shared the 1970 Nobel Prize in Physiology or Medicine with Bernard Katz and Ulf von Euler."),
    ("Carl Gustaf Mosander", "1797-1858", "Swedish", "chemist",
     "Mosander, a student of Berzelius, discovered lanthanum in 1839 and separated erbium and terbium from "
     "yttria in 1843."),
    ("Jöns Jacob Berzelius", "1779-1848", "Swedish", "chemist",
     "Berzelius devised modern chemical notation, measured atomic weights and discovered cerium, selenium and "
     "thorium. He taught in Stockholm at the Karolinska Institute."),
    ("Carl Wilhelm Scheele", "1742-1786", "Swedish-German", "pharmaceutical chemist",
     "Scheele discovered oxygen independently of Joseph Priestley and was the first to describe chlorine."),
    ("Johan Gadolin", "1760-1852", "Finnish", "chemist",
     "Gadolin analysed a black mineral from Ytterby and in 1794 found a new earth, yttria. The element gadolinium "
     "and the mineral gadolinite are named after him."),
    ("Lars Fredrik Nilson", "1840-1899", "Swedish", "chemist",
     "Nilson discovered scandium in 1879 while working with the minerals euxenite and gadolinite at Uppsala."),
    ("Marc Delafontaine", "1837-1911", "Swiss", "chemist",
     "Delafontaine studied rare earths in Geneva; with Jacques-Louis Soret he observed the spectroscopic "
     "signature of the element later called holmium in 1878."),
    ("Jacques-Louis Soret", "1827-1890", "Swiss", "chemist and physicist",
     "Soret worked in Geneva on spectroscopy. In 1878 he and Marc Delafontaine reported absorption bands of an "
     "unknown element, which he called element X; it was later named holmium."),
    ("Paul-Émile Lecoq de Boisbaudran", "1838-1912", "French", "chemist",
     "Lecoq de Boisbaudran discovered gallium in 1875, samarium in 1879 and dysprosium in 1886."),
    ("Georges Urbain", "1872-1938", "French", "chemist",
     "Urbain separated lutetium from ytterbia in 1907 and named it after Lutetia, the Latin name of Paris."),
    ("George de Hevesy", "1885-1966", "Hungarian", "radiochemist",
     "De Hevesy co-discovered hafnium with Dirk Coster in Copenhagen in 1923 and received the 1943 Nobel Prize in "
     "Chemistry for the use of isotopes as tracers."),
    ("Dirk Coster", "1889-1950", "Dutch", "physicist",
     "Coster co-discovered hafnium with George de Hevesy in 1923 at Niels Bohr's institute in Copenhagen."),
    ("Marie Curie", "1867-1934", "Polish-French", "physicist and chemist",
     "Marie Curie discovered polonium and radium with Pierre Curie in 1898. She received the Nobel Prize in Physics "
     "in 1903 and the Nobel Prize in Chemistry in 1911."),
    ("Humphry Davy", "1778-1829", "English", "chemist",
     "Davy isolated sodium and potassium in 1807 and magnesium, calcium and barium in 1808 by electrolysis."),
    ("Svante Arrhenius", "1859-1927", "Swedish", "physical chemist",
     "Arrhenius received the 1903 Nobel Prize in Chemistry for his electrolytic theory of dissociation."),
    ("Isambard Kingdom Brunel", "1806-1859", "English", "engineer",
     "Brunel built the Great Western Railway and designed the steamships Great Western, Great Britain and Great "
     "Eastern, the largest ship of its time, launched in 1858."),
    ("James Anderson (captain)", "1824-1893", "Scottish", "sea captain",
     "Captain James Anderson commanded the steamship Great Eastern during the cable expeditions of 1865 and 1866. "
     "After the successful laying of the 1866 transatlantic telegraph cable he was knighted."),
    ("Cyrus West Field", "1819-1892", "American", "businessman",
     "Field founded the Atlantic Telegraph Company and promoted the transatlantic telegraph cables of 1858, 1865 "
     "and 1866."),
    ("William Thomson, Lord Kelvin", "1824-1907", "British", "physicist and engineer",
     "Thomson advised the Atlantic Telegraph Company, invented the mirror galvanometer for cable signalling and "
     "sailed on the Great Eastern in 1865 and 1866. He was knighted in 1866."),
    ("Daniel Gooch", "1816-1889", "English", "railway engineer",
     "Gooch chaired the Great Eastern's owners and sailed on the 1866 cable expedition; he was made a baronet "
     "afterwards."),
]

NOBEL_MEDICINE = {
    1965: "François Jacob, André Lwoff and Jacques Monod, for discoveries concerning genetic control of enzyme and virus synthesis",
    1966: "Peyton Rous, for the discovery of tumour-inducing viruses, and Charles Brenton Huggins, for hormonal treatment of prostatic cancer",
    1967: "Ragnar Granit, Haldan Keffer Hartline and George Wald, for discoveries concerning the visual processes in the eye",
    1968: "Robert W. Holley, Har Gobind Khorana and Marshall W. Nirenberg, for their interpretation of the genetic code",
    1969: "Max Delbrück, Alfred D. Hershey and Salvador E. Luria, for discoveries concerning the replication and genetic structure of viruses",
    1970: "Bernard Katz, Ulf von Euler and Julius Axelrod, for discoveries concerning the humoral transmitters in the nerve terminals",
    1971: "Earl W. Sutherland Jr., for discoveries concerning the mechanisms of the action of hormones",
    1972: "Gerald M. Edelman and Rodney R. Porter, for discoveries concerning the chemical structure of antibodies",
    1973: "Karl von Frisch, Konrad Lorenz and Nikolaas Tinbergen, for discoveries concerning individual and social behaviour patterns",
    1974: "Albert Claude, Christian de Duve and George E. Palade, for discoveries concerning the structural and functional organisation of the cell",
    1975: "David Baltimore, Renato Dulbecco and Howard Martin Temin, for discoveries concerning the interaction between tumour viruses and the genetic material of the cell",
}

# (name, place, country, main span in metres, year opened, type note)
BRIDGES = [
    ("Akashi Kaikyō Bridge", "the Akashi Strait between Kobe and Awaji Island", "Japan", 1991, 1998,
     "It held the record for the longest suspension bridge span in the world from 1998 until 2022."),
    ("Great Belt East Bridge", "the eastern channel of the Great Belt between Zealand and Sprogø", "Denmark", 1624, 1998,
     "It is part of the Great Belt Fixed Link and was the second-longest suspension span in the world when it opened."),
    ("Humber Bridge", "the Humber estuary between Hessle and Barton-upon-Humber", "England", 1410, 1981,
     "It was the longest single-span suspension bridge in the world for 16 years after it opened."),
    ("1915 Çanakkale Bridge", "the Dardanelles strait", "Turkey", 2023, 2022,
     "It overtook the Akashi Kaikyō Bridge as the suspension bridge with the longest main span."),
    ("Golden Gate Bridge", "the Golden Gate strait at San Francisco", "United States", 1280, 1937,
     "It was the longest suspension span in the world from 1937 to 1964."),
    ("Verrazzano-Narrows Bridge", "the Narrows between Staten Island and Brooklyn, New York", "United States", 1298, 1964,
     "It took the record from the Golden Gate Bridge and held it until the Humber Bridge opened in 1981."),
    ("Tsing Ma Bridge", "Ma Wan and Tsing Yi island in Hong Kong", "China", 1377, 1997,
     "It carries both road and rail traffic on two decks."),
    ("Xihoumen Bridge", "the Zhoushan archipelago in Zhejiang", "China", 1650, 2009,
     "It links Jintang Island with Cezi Island."),
    ("Runyang Yangtze River Bridge", "the Yangtze river near Zhenjiang", "China", 1490, 2005,
     "Its southern suspension section has the main span."),
    ("Yi Sun-sin Bridge", "Gwangyang Bay", "South Korea", 1545, 2012, "It is named after the admiral Yi Sun-sin."),
    ("Osman Gazi Bridge", "the Gulf of İzmit", "Turkey", 1550, 2016, "It shortened the road trip between Istanbul and İzmir."),
    ("Höga Kusten Bridge", "the mouth of the Ångerman river", "Sweden", 1210, 1997,
     "It is one of the longest suspension bridges in Scandinavia."),
    ("Hardanger Bridge", "the Hardangerfjord", "Norway", 1310, 2013, "It replaced a ferry crossing."),
    ("Mackinac Bridge", "the Straits of Mackinac in Michigan", "United States", 1158, 1957,
     "It connects the Upper and Lower Peninsulas of Michigan."),
    ("Forth Road Bridge", "the Firth of Forth near Edinburgh", "Scotland", 1006, 1964,
     "It stands beside the Forth Bridge, a cantilever railway bridge of 1890."),
    ("Severn Bridge", "the River Severn between England and Wales", "United Kingdom", 988, 1966,
     "It pioneered the aerodynamic box-girder deck later used on the Humber Bridge."),
    ("Jiangyin Yangtze River Bridge", "the Yangtze river at Jiangyin", "China", 1385, 1999,
     "It was the first Chinese bridge with a span over one kilometre."),
    ("Brooklyn Bridge", "the East River in New York City", "United States", 486, 1883,
     "It was the longest suspension bridge in the world when it opened."),
    ("George Washington Bridge", "the Hudson River between Manhattan and Fort Lee", "United States", 1067, 1931,
     "It nearly doubled the previous record span when it opened."),
    ("25 de Abril Bridge", "the Tagus river at Lisbon", "Portugal", 1013, 1966,
     "It carries a road deck and, since 1999, a railway deck."),
    ("Bosphorus Bridge", "the Bosphorus strait in Istanbul", "Turkey", 1074, 1973,
     "It was the first bridge between Europe and Asia across the Bosphorus."),
    ("Kurushima-Kaikyō Bridge", "the Kurushima Strait in the Seto Inland Sea", "Japan", 1030, 1999,
     "It consists of three consecutive suspension bridges."),
    ("Minami Bisan-Seto Bridge", "the Seto Inland Sea between Honshu and Shikoku", "Japan", 1100, 1988,
     "It carries both road and rail traffic."),
    ("Little Belt Bridge (1970)", "the Little Belt strait between Jutland and Funen", "Denmark", 600, 1970,
     "It is the first suspension bridge built in Denmark."),
    ("Tacoma Narrows Bridge (1950)", "the Tacoma Narrows in Washington State", "United States", 853, 1950,
     "It replaced the 1940 bridge that collapsed in a windstorm."),
]

# (name, launch date, rocket, launch site, operator, note)
MISSIONS = [
    ("James Webb Space Telescope", "25 December 2021", "Ariane 5", "the Guiana Space Centre near Kourou, French Guiana",
     "NASA, ESA and the Canadian Space Agency",
     "It is an infrared observatory with a 6.5-metre segmented mirror, operating near the Sun-Earth L2 point."),
    ("Hubble Space Telescope", "24 April 1990", "the Space Shuttle Discovery (mission STS-31)",
     "the Kennedy Space Center in Florida", "NASA and ESA",
     "It has a 2.4-metre mirror and orbits the Earth at about 540 kilometres."),
    ("Spitzer Space Telescope", "25 August 2003", "a Delta II rocket", "Cape Canaveral, Florida", "NASA",
     "It observed in the infrared until its retirement in January 2020."),
    ("Kepler space telescope", "7 March 2009", "a Delta II rocket", "Cape Canaveral, Florida", "NASA",
     "It searched for Earth-sized exoplanets by watching stars for transits."),
    ("Transiting Exoplanet Survey Satellite (TESS)", "18 April 2018", "a Falcon 9 rocket", "Cape Canaveral, Florida",
     "NASA", "It surveys bright nearby stars for transiting planets."),
    ("Gaia (spacecraft)", "19 December 2013", "a Soyuz-Fregat rocket", "the Guiana Space Centre near Kourou",
     "ESA", "It measured the positions and motions of more than a billion stars."),
    ("Chandra X-ray Observatory", "23 July 1999", "the Space Shuttle Columbia (mission STS-93)",
     "the Kennedy Space Center in Florida", "NASA", "It observes X-rays from hot regions of the universe."),
    ("Herschel Space Observatory", "14 May 2009", "an Ariane 5 rocket, together with Planck",
     "the Guiana Space Centre near Kourou", "ESA", "It had the largest mirror of any infrared telescope before Webb."),
    ("Planck (spacecraft)", "14 May 2009", "an Ariane 5 rocket, together with Herschel",
     "the Guiana Space Centre near Kourou", "ESA", "It mapped the cosmic microwave background."),
    ("Euclid (spacecraft)", "1 July 2023", "a Falcon 9 rocket", "Cape Canaveral, Florida", "ESA",
     "It maps the geometry of the dark universe."),
    ("Fermi Gamma-ray Space Telescope", "11 June 2008", "a Delta II rocket", "Cape Canaveral, Florida", "NASA",
     "It surveys the sky in gamma rays."),
    ("Wide-field Infrared Survey Explorer (WISE)", "14 December 2009", "a Delta II rocket",
     "Vandenberg Air Force Base, California", "NASA", "It mapped the whole sky in four infrared bands."),
    ("XMM-Newton", "10 December 1999", "an Ariane 5 rocket", "the Guiana Space Centre near Kourou", "ESA",
     "It is an X-ray observatory with three mirror modules."),
    ("CHEOPS", "18 December 2019", "a Soyuz-Fregat rocket", "the Guiana Space Centre near Kourou", "ESA",
     "It measures the sizes of known exoplanets."),
    ("Rosetta (spacecraft)", "2 March 2004", "an Ariane 5 rocket", "the Guiana Space Centre near Kourou", "ESA",
     "It studied comet 67P/Churyumov-Gerasimenko and delivered the Philae lander."),
    ("Compton Gamma Ray Observatory", "5 April 1991", "the Space Shuttle Atlantis (mission STS-37)",
     "the Kennedy Space Center in Florida", "NASA", "It was the second of NASA's Great Observatories."),
]

ROCKETS = [
    ("Ariane 5", "a European heavy-lift launch vehicle operated by Arianespace from the Guiana Space Centre. It flew "
     "from 1996 to 2023; notable payloads include Rosetta, Herschel and Planck, and the James Webb Space Telescope, "
     "launched on 25 December 2021 on flight VA256."),
    ("Ariane 6", "the successor of Ariane 5, developed for ESA and first launched on 9 July 2024 from Kourou."),
    ("Soyuz-Fregat", "a Soyuz rocket with a Fregat upper stage; a version was launched from the Guiana Space Centre "
     "between 2011 and 2022, carrying Gaia and CHEOPS among other payloads."),
    ("Falcon 9", "a partially reusable rocket built by SpaceX; it launched TESS in 2018 and Euclid in 2023."),
    ("Delta II", "an American rocket flown from 1989 to 2018; it launched Spitzer, Kepler, Fermi and WISE."),
    ("Space Shuttle", "NASA's reusable crewed spacecraft, flown from 1981 to 2011; shuttles deployed the Hubble Space "
     "Telescope in 1990 and the Chandra X-ray Observatory in 1999."),
    ("Atlas V", "an American expendable rocket in service since 2002, used for many NASA planetary missions."),
    ("Vega (rocket)", "a European small-lift rocket launched from the Guiana Space Centre since 2012."),
]

SITES = [
    ("Guiana Space Centre", "Europe's spaceport near Kourou in French Guiana, close to the equator. Ariane 5, Ariane 6, "
     "Vega and Soyuz rockets have flown from it; the James Webb Space Telescope was launched there in 2021."),
    ("Kennedy Space Center", "NASA's launch centre on Merritt Island, Florida, the base of the Space Shuttle programme."),
    ("Cape Canaveral Space Force Station", "a launch site in Florida next to the Kennedy Space Center, used by Delta, "
     "Atlas and Falcon 9 rockets."),
    ("Vandenberg Space Force Base", "a launch site on the coast of California used for polar orbits."),
    ("Baikonur Cosmodrome", "the launch site in Kazakhstan from which Sputnik 1 and Yuri Gagarin were launched."),
    ("Kourou", "a town in French Guiana, home of the Guiana Space Centre."),
]

SHIPS = [
    ("SS Great Eastern", "an iron steamship designed by Isambard Kingdom Brunel and launched in 1858, by far the "
     "largest ship of its time. Converted to a cable layer, she laid the first lasting transatlantic telegraph cable "
     "in 1866 under Captain James Anderson, landing it at Heart's Content, Newfoundland, on 27 July 1866. She then "
     "recovered and completed the cable lost in 1865."),
    ("HMS Agamemnon (1852)", "a Royal Navy ship of the line that, with USS Niagara, laid the first transatlantic "
     "telegraph cable in 1858; that cable failed after about three weeks."),
    ("USS Niagara (1855)", "a United States Navy steam frigate that shared the laying of the 1858 Atlantic cable with "
     "HMS Agamemnon."),
    ("CS Faraday (1874)", "a purpose-built cable ship launched in 1874 for Siemens Brothers, used to lay several "
     "Atlantic cables."),
    ("SS Great Britain", "Brunel's iron-hulled screw steamship launched in 1843, now a museum ship in Bristol."),
    ("SS Great Western", "Brunel's wooden paddle steamer of 1838, built for the transatlantic passenger service."),
    ("RMS Titanic", "a British passenger liner that sank on 15 April 1912 after striking an iceberg; the cable ship "
     "Mackay-Bennett later recovered many victims."),
    ("CS Mackay-Bennett", "a cable repair ship based at Halifax, Nova Scotia, known for recovering bodies after the "
     "sinking of the Titanic in 1912."),
]

CABLE_EVENTS = [
    ("Transatlantic telegraph cable of 1858", "The first cable across the Atlantic was laid in August 1858 by HMS "
     "Agamemnon and USS Niagara. Queen Victoria and President James Buchanan exchanged messages, but the cable "
     "failed after about three weeks."),
    ("Transatlantic telegraph cable of 1865", "The Great Eastern, under Captain James Anderson, tried to lay a new "
     "cable in 1865, but it broke about 1,200 kilometres from Newfoundland and could not be recovered that year."),
    ("Transatlantic telegraph cable of 1866", "The first lasting transatlantic telegraph cable was laid in July 1866 by "
     "the steamship Great Eastern, commanded by Captain James Anderson, from Valentia Island in Ireland to Heart's "
     "Content in Newfoundland. The expedition then recovered the 1865 cable and completed it, giving two working "
     "lines."),
    ("Atlantic Telegraph Company", "a company founded in 1856 by Cyrus West Field and British partners to lay a "
     "telegraph cable across the Atlantic. It organised the expeditions of 1858, 1865 and 1866."),
    ("Valentia Island", "an island off County Kerry in Ireland, the eastern end of the early transatlantic telegraph "
     "cables of 1858 and 1866."),
    ("Heart's Content", "a town in Newfoundland where the 1866 transatlantic telegraph cable came ashore on 27 July 1866."),
]

CITIES = [
    ("Stockholm", "the capital of Sweden. Its Latin name is Holmia, which gave its name to the element holmium."),
    ("Copenhagen", "the capital of Denmark. Its Latin name is Hafnia, which gave its name to the element hafnium."),
    ("Oslo", "the capital of Norway; the city was called Christiania from 1624 to 1925."),
    ("Helsinki", "the capital of Finland, called Helsingfors in Swedish."),
    ("Paris", "the capital of France. Its Latin name is Lutetia, which gave its name to the element lutetium."),
    ("Uppsala", "a university city north of Stockholm; Uppsala University was founded in 1477."),
    ("Ytterby", "a village on the island of Resarö near Stockholm whose quarry gave four elements their names: "
     "yttrium, terbium, erbium and ytterbium."),
    ("Kobe", "a port city in Japan at the northern end of the Akashi Kaikyō Bridge."),
    ("Hessle", "a town in the East Riding of Yorkshire at the northern end of the Humber Bridge."),
    ("Reykjavík", "the capital of Iceland."),
]


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def build() -> list[dict]:
    docs: list[dict] = []

    def add(kind: str, title: str, url: str, text: str) -> None:
        docs.append({"id": f"{kind}-{len(docs):04d}", "title": title, "url": url, "text": text})

    for name, sym, z, year, who, origin in ELEMENTS:
        found = "has been known since antiquity" if year == "antiquity" else f"was discovered in {year} by {who}"
        add("el", f"{name} - Wikipedia", f"https://en.wikipedia.org/wiki/{slug(name)}",
            f"{name} is a chemical element with the symbol {sym} and atomic number {z}. It {found}. "
            f"The name comes from {origin}.")
        add("el", f"{name} ({sym}) - element facts", f"https://www.rsc.org/periodic-table/element/{z}/{name.lower()}",
            f"Element {z}: {name} ({sym}). Discovery: {year}; discovered by {who}. Origin of the name: {origin}. "
            f"See the periodic table for its group, period and properties.")
    for name, life, nat, field, summary in PEOPLE:
        add("person", f"{name} - Wikipedia", f"https://en.wikipedia.org/wiki/{slug(name)}",
            f"{name} ({life}) was a {nat} {field}. {summary}")
        add("person", f"{name} | Biography", f"https://www.britannica.com/biography/{slug(name)}",
            f"Biography of {name}, {nat} {field} ({life}). {summary.split('. ')[0]}.")
    for year, text in NOBEL_MEDICINE.items():
        add("nobel", f"The Nobel Prize in Physiology or Medicine {year}",
            f"https://www.nobelprize.org/prizes/medicine/{year}/summary/",
            f"The Nobel Prize in Physiology or Medicine {year} was awarded to {text}.")
    add("nobel", "Nobel Prize in Chemistry 1929", "https://www.nobelprize.org/prizes/chemistry/1929/summary/",
        "The Nobel Prize in Chemistry 1929 was awarded jointly to Arthur Harden and Hans von Euler-Chelpin for their "
        "investigations on the fermentation of sugar and fermentative enzymes.")
    add("nobel", "Nobel Prize in Chemistry 1943", "https://www.nobelprize.org/prizes/chemistry/1943/summary/",
        "The Nobel Prize in Chemistry 1943 was awarded to George de Hevesy for his work on the use of isotopes as "
        "tracers in the study of chemical processes.")
    add("nobel", "List of Nobel laureates in Physiology or Medicine (1965-1975)",
        "https://en.wikipedia.org/wiki/List_of_Nobel_laureates_in_Physiology_or_Medicine",
        " ".join(f"{y}: {t.split(', for')[0]}." for y, t in NOBEL_MEDICINE.items()))
    for name, place, country, span, year, note in BRIDGES:
        add("bridge", f"{name} - Wikipedia", f"https://en.wikipedia.org/wiki/{slug(name)}",
            f"The {name} is a suspension bridge across {place}, {country}. It opened in {year} and has a main span "
            f"of {span} metres ({span * 3.28084:,.0f} ft). {note}")
        add("bridge", f"{name}: facts and figures", f"https://structurae.net/en/structures/{slug(name).lower()}",
            f"Structure: {name}. Type: suspension bridge. Location: {place}, {country}. Completed: {year}. "
            f"Main span: {span} m.")
    ranked = sorted(BRIDGES, key=lambda b: -b[3])
    add("bridge", "List of longest suspension bridge spans",
        "https://en.wikipedia.org/wiki/List_of_longest_suspension_bridge_spans",
        "Suspension bridges ranked by the length of their main span: " +
        "; ".join(f"{i + 1}. {b[0]} ({b[2]}, {b[4]}): {b[3]} m" for i, b in enumerate(ranked)) + ".")
    for name, date, rocket, site, operator, note in MISSIONS:
        add("space", f"{name} - Wikipedia", f"https://en.wikipedia.org/wiki/{slug(name)}",
            f"The {name} is a space observatory operated by {operator}. It was launched on {date} on {rocket} from "
            f"{site}. {note}")
        add("space", f"{name} launch", f"https://www.esa.int/Science_Exploration/{slug(name)}_launch",
            f"Launch record: {name}. Date: {date}. Vehicle: {rocket}. Site: {site}.")
    for name, text in ROCKETS:
        add("rocket", f"{name} - Wikipedia", f"https://en.wikipedia.org/wiki/{slug(name)}", f"{name} is {text}")
    for name, text in SITES:
        add("site", f"{name} - Wikipedia", f"https://en.wikipedia.org/wiki/{slug(name)}", f"{name} is {text}")
    for name, text in SHIPS:
        add("ship", f"{name} - Wikipedia", f"https://en.wikipedia.org/wiki/{slug(name)}", f"{name} was {text}")
        add("ship", f"{name} | Maritime history", f"https://www.rmg.co.uk/stories/{slug(name).lower()}",
            f"From the museum archive: {name}, {text.split('. ')[0]}.")
    for name, text in CABLE_EVENTS:
        add("cable", f"{name} - Wikipedia", f"https://en.wikipedia.org/wiki/{slug(name)}", f"{name}. {text}")
        add("cable", f"{name} - Atlantic cable history", f"https://atlantic-cable.com/{slug(name)}",
            f"History of the Atlantic cable: {text}")
    for name, text in CITIES:
        add("city", f"{name} - Wikipedia", f"https://en.wikipedia.org/wiki/{slug(name)}", f"{name} is {text}")
    return docs


def main() -> None:
    docs = build()
    urls = [d["url"] for d in docs]
    assert len(urls) == len(set(urls)), "duplicate URLs"
    out = HERE / "docs.jsonl"
    out.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    print(f"wrote {len(docs)} documents to {out}")


if __name__ == "__main__":
    main()
