package robotemu

type price struct {
	location          string
	net, gross, setup string
}

type product struct {
	id, name    string
	description []string
	prices      []price
}

// catalog is the emulator's server product catalog: Robot's shape, with
// monthly net and gross prices per location and a one-time setup price.
var catalog = []product{
	{
		id: "EX44", name: "Dedicated Root Server EX44",
		description: []string{"Intel Core i5-13500", "64 GB DDR4", "2 x 512 GB NVMe SSD", "1 Gbit/s bandwidth"},
		prices: []price{
			{"FSN1", "44.0000", "52.3600", "0.0000"},
			{"NBG1", "44.0000", "52.3600", "0.0000"},
			{"HEL1", "44.0000", "52.3600", "0.0000"},
		},
	},
	{
		id: "GEX44", name: "Dedicated GPU Server GEX44",
		description: []string{"Intel Core i5-13500", "64 GB DDR4", "2 x 1.92 TB NVMe SSD", "NVIDIA RTX 4000 SFF Ada Generation", "1 Gbit/s bandwidth"},
		prices: []price{
			{"FSN1", "184.0000", "218.9600", "79.0000"},
		},
	},
	{
		id: "GEX130", name: "Dedicated GPU Server GEX130",
		description: []string{"Intel Xeon Gold 5412U", "128 GB DDR5 ECC", "2 x 1.92 TB NVMe SSD", "NVIDIA RTX 6000 Ada Generation", "1 Gbit/s bandwidth"},
		prices: []price{
			{"FSN1", "813.0000", "967.4700", "79.0000"},
			{"NBG1", "813.0000", "967.4700", "79.0000"},
		},
	},
	{
		id: "AX102", name: "Dedicated Root Server AX102",
		description: []string{"AMD Ryzen 9 7950X3D", "128 GB DDR5 ECC", "2 x 1.92 TB NVMe SSD", "1 Gbit/s bandwidth"},
		prices: []price{
			{"FSN1", "104.0000", "123.7600", "39.0000"},
			{"NBG1", "104.0000", "123.7600", "39.0000"},
			{"HEL1", "104.0000", "123.7600", "39.0000"},
		},
	},
}
