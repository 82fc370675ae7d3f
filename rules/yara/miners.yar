/*
 * gpuguard YARA rules: miner strings (see docs/rules.md, "YARA").
 *
 * meta scope says where a rule applies: file (the executable), cmdline,
 * environ, memory.  Rules that apply to memory never test the ELF header:
 * a memory region starts anywhere.  Tag "miner" feeds the rule yara-miner.
 */

rule xmrig_strings : miner
{
    meta:
        description = "XMRig banner, help and donate strings"
        scope = "file,memory"
    strings:
        $banner = "XMRig/%s libuv/%s" ascii
        $keys = "'h' hashrate, 'p' pause, 'r' resume" ascii
        $donate1 = "donate.v2.xmrig.com" ascii
        $donate2 = "donate.ssl.xmrig.com" ascii
        $opt1 = "--donate-level" ascii
        $opt2 = "randomx-1gb-pages" ascii
    condition:
        2 of them
}

rule cpuminer_strings : miner
{
    meta:
        description = "cpuminer / cpuminer-opt user agent and stratum errors"
        scope = "file,memory"
    strings:
        $ua = "User-Agent: cpuminer/" ascii
        $merkle = "Stratum notify: invalid Merkle branch" ascii
        $auth = "mining.authorize" ascii
        $subscribe = "mining.subscribe" ascii
    condition:
        $ua or ($merkle and ($auth or $subscribe))
}

rule stratum_client_strings : miner
{
    meta:
        description = "stratum client method names together (mining client code or buffers)"
        scope = "file,memory"
    strings:
        $m1 = "mining.subscribe" ascii
        $m2 = "mining.authorize" ascii
        $m3 = "mining.submit" ascii
        $m4 = "mining.set_target" ascii
        $m5 = "mining.notify" ascii
        $m6 = "mining.set_difficulty" ascii
        $m7 = "mining.extranonce.subscribe" ascii
    condition:
        4 of them
}

rule stratum_url_in_cmdline : miner
{
    meta:
        description = "stratum URL in the command line"
        scope = "cmdline,environ"
    strings:
        $url = /stratum[12]?\+(tcp|ssl|tls|udp):\/\// nocase
    condition:
        $url
}
